"""``dynamics eval RUN_DIR --tasks T1,T2 [--limit N] [--num-fewshot N] [--apply-chat-template]
[--system-instruction TEXT]``: lm-evaluation-harness on the base
model and on the run's best checkpoint, written to ``RUN_DIR/lm_eval.json`` (shown by
``dynamics report RUN_DIR``; docs/lm-eval.md)."""

from __future__ import annotations

import argparse
from typing import Any

HELP = "evaluate the base model and the best checkpoint of a run with lm-evaluation-harness tasks"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a folder written by 'dynamics run' or the Trainer callback",
    )
    parser.add_argument(
        "--tasks",
        required=True,
        help="lm-eval task names, comma-separated (e.g. tinyMMLU,tinyHellaswag)",
    )
    parser.add_argument(
        "--limit",
        type=float,
        help="at most this many documents per task (a fraction when below 1), as lm-eval's --limit",
    )
    parser.add_argument(
        "--include-path", metavar="DIR", help="a folder of lm-eval task YAMLs (local tasks)"
    )
    parser.add_argument(
        "--base",
        metavar="MODEL",
        help="the base model's hub id or folder, when the run config names none",
    )
    parser.add_argument(
        "--batch-size", default="8", help="lm-eval's batch size (an integer, or 'auto')"
    )
    parser.add_argument("--device", help="e.g. cuda:0 or cpu (default: cuda when available)")
    parser.add_argument(
        "--num-fewshot",
        type=int,
        metavar="N",
        help="few-shot examples per document, as lm-eval's --num_fewshot",
    )
    parser.add_argument(
        "--apply-chat-template",
        action="store_true",
        default=None,
        help="put each context through the tokenizer's chat template, "
        "as lm-eval's --apply_chat_template",
    )
    parser.add_argument(
        "--fewshot-as-multiturn",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --apply-chat-template, few-shot examples as turns of the chat "
        "(lm-eval's default)",
    )
    parser.add_argument(
        "--system-instruction", metavar="TEXT", help="lm-eval's --system_instruction"
    )


def main(args: argparse.Namespace) -> int:
    from dynamics.commands.errors import UsageError

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    limit = args.limit
    if limit is not None and (limit <= 0 or (limit >= 1 and not limit.is_integer())):
        raise UsageError(
            f"--limit {limit:g}: give a document count (1, 2, ...) or a fraction in (0, 1)"
        )
    if limit is not None and limit >= 1:
        limit = int(limit)
    batch_size = args.batch_size if args.batch_size == "auto" else _positive(args.batch_size)

    from dynamics.engine.harness import LM_EVAL_FILE, HarnessError, evaluate_run
    from dynamics.report.lm_eval import lm_eval_table

    try:
        record = evaluate_run(
            args.run_dir,
            tasks,
            limit=limit,
            include_path=args.include_path,
            base=args.base,
            batch_size=batch_size,
            device=args.device,
            options=_prompt_options(args),
        )
    except HarnessError as err:
        raise UsageError(str(err)) from None
    print("\n".join(lm_eval_table(record)))
    print(f"written: {args.run_dir.rstrip('/')}/{LM_EVAL_FILE}")
    return 0


def _prompt_options(args: argparse.Namespace) -> dict[str, Any]:
    """The prompt options given, by ``simple_evaluate``'s names; the others keep its defaults."""
    from dynamics.commands.errors import UsageError
    from dynamics.engine.harness import EVAL_OPTIONS

    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise UsageError(f"--num-fewshot {args.num_fewshot}: give a count >= 0")
    if args.fewshot_as_multiturn and not args.apply_chat_template:
        raise UsageError("--fewshot-as-multiturn shapes a chat: give --apply-chat-template too")
    given = {name: getattr(args, name) for name in EVAL_OPTIONS}
    return {name: value for name, value in given.items() if value is not None}


def _positive(text: str) -> int:
    from dynamics.commands.errors import UsageError

    if not text.isdecimal() or int(text) < 1:
        raise UsageError(f"--batch-size {text}: give a positive integer or 'auto'")
    return int(text)

"""Rows of an lm-evaluation-harness task, built by the task's own code (docs/lm-eval.md).

Public API:

- ``task_manager(names, include_path)``: lm-eval's ``TaskManager`` for those tasks, without
  indexing lm-eval's own tasks when every name is a task or group of ``include_path``.
- ``load_tasks(source) -> dict``: the task objects of ``source.lm_eval_task`` (one task, or
  every task of a group), checked (multiple choice; ``source.lm_eval_metric`` reported when
  the metric is accuracy) and configured as ``simple_evaluate`` configures them: few-shot
  count (``lm_eval_num_fewshot``, else the task's own, else 0) and few-shot seed.
- ``seeded_as_simple_evaluate()``: a context in which Python's, numpy's and torch's global
  generators are seeded as ``simple_evaluate`` seeds them, restored on exit.
- ``task_rows(source) -> datasets.Dataset``: one row per document of the task's (or the
  group's tasks') evaluation split, as ``lm_eval.simple_evaluate`` builds its requests: the
  tasks are loaded with ``load_tasks`` under ``seeded_as_simple_evaluate`` and
  ``Task.build_all_requests`` (with ``lm_eval_system_instruction``) makes each document's
  loglikelihood requests: a context (``fewshot_context``: system instruction, description,
  few-shot examples, ``doc_to_text``) and a continuation (``target_delimiter`` + each
  ``doc_to_choice``). Columns: ``contexts`` and ``continuations`` (one string per choice),
  ``answer`` (the correct choice), ``choice_lengths`` (each choice's length in characters,
  ``acc_norm``'s divisor), ``task`` and ``doc_id``.
  With ``lm_eval_apply_chat_template`` a context is the chat lm-eval's task built
  (``fewshot_as_multiturn`` or not), as JSON, rendered later by ``render_chats``.
- ``render_chats(tokenizer, contexts) -> list[str]``: those chats rendered by lm-eval's
  ``HFLM.apply_chat_template`` with the tokenizer's chat template.
- ``encode_pairs(tokenizer, contexts, continuations)``: the token ids of each
  (context, continuation) pair as lm-eval's ``hf`` model encodes them (its own
  ``loglikelihood`` tokenization, by an ``HFLM`` built by its own ``__init__``: the
  context's trailing spaces moved to the continuation, the whole text encoded and split at
  the context's length, an empty context replaced by the BOS or EOS token).

The correct choice is the one lm-eval itself scores as right: ``Task.process_results`` is
asked, for each choice in turn, what ``acc`` (or ``acc_norm``, for a task that reports only
that) it gives when that choice has the highest log-likelihood, so the answer follows the
task's ``doc_to_target`` (an index, a choice's text, or ``doc_to_text`` for a task with
several inputs) exactly as lm-eval reads it.

``lm_eval`` is the optional extra ``lm-eval``; it is imported only here, when a dataset
names an ``lm_eval_task``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import random
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from dynamics.data.errors import DataError, one_line

if TYPE_CHECKING:
    from dynamics.data.source import DataSource

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def seeded_as_simple_evaluate() -> Iterator[None]:
    """Python's, numpy's and torch's global generators seeded as ``simple_evaluate`` seeds
    them by default before it loads its tasks (a task's ``process_docs`` may shuffle with
    them), and put back as they were afterwards, so building rows leaves a run's own random
    streams untouched."""
    import torch
    from lm_eval.defaults import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED

    # numpy's legacy global generator is the one simple_evaluate seeds and tasks draw from.
    python_state, numpy_state = random.getstate(), np.random.get_state()  # noqa: NPY002
    with torch.random.fork_rng(devices=[]):
        random.seed(DEFAULT_RANDOM_SEED)
        np.random.seed(DEFAULT_OTHER_SEED)  # noqa: NPY002
        torch.manual_seed(DEFAULT_OTHER_SEED)
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)  # noqa: NPY002


def _lm_eval() -> Any:
    try:
        import lm_eval.tasks
    except ImportError:
        raise DataError(
            "lm_eval_task needs lm-evaluation-harness: pip install "
            "'dynamics[lm-eval]' (or lm_eval==0.4.13)"
        ) from None
    return lm_eval.tasks


def task_manager(names: Sequence[str], include_path: str | None) -> Any:
    """lm-eval's ``TaskManager`` for the tasks ``names``: the tasks of ``include_path`` alone
    when every name is a task or group there (indexing lm-eval's own ~14,700 tasks takes
    about 8 s on a CPU core), otherwise those of ``include_path`` and lm-eval's own."""
    tasks = _lm_eval()
    if include_path is not None:
        local = tasks.TaskManager(include_path=include_path, include_defaults=False)
        if all(name in local.all_tasks for name in names):
            return local
    return tasks.TaskManager(include_path=include_path)


def load_tasks(source: DataSource) -> dict[str, Any]:
    """The lm-eval task objects of ``source.lm_eval_task`` by name (one task, or every task
    of a group), each configured as ``simple_evaluate`` configures it: its few-shot count
    (``lm_eval_num_fewshot``, else its own, else 0) and its few-shot sampler's seed."""
    from lm_eval.defaults import DEFAULT_OTHER_SEED

    assert source.lm_eval_task is not None
    name = source.lm_eval_task
    try:
        loaded = task_manager([name], source.lm_eval_include_path).load([name])["tasks"]
    except Exception as err:  # lm-eval raises plain KeyErrors and ValueErrors, and datasets' errors
        raise DataError(
            f"{source.description}: lm-eval task {name!r} could not be loaded ({one_line(err)}); "
            "check lm_eval_task (and lm_eval_include_path, the folder of a local task's YAML)"
        ) from None
    for task_name, task in loaded.items():
        _check_task(task, task_name, source)
        _set_num_fewshot(task, source.lm_eval_num_fewshot)
        task.set_fewshot_seed(seed=DEFAULT_OTHER_SEED)
    return dict(loaded)


def _check_task(task: Any, name: str, source: DataSource) -> None:
    if task.OUTPUT_TYPE != "multiple_choice":
        raise DataError(
            f"{source.description}: lm-eval task {name!r} has output_type {task.OUTPUT_TYPE!r}; "
            "only multiple_choice tasks (scored by acc or acc_norm) can be a dataset"
        )
    reported = [metric for metric in ("acc", "acc_norm") if metric in task._metric_fn_list]
    if source.metric == "accuracy" and source.lm_eval_metric not in reported:
        fix = (
            f"set lm_eval_metric: {reported[0]}" if reported else "add it to the task's metric_list"
        )
        raise DataError(
            f"{source.description}: lm-eval task {name!r} reports no {source.lm_eval_metric!r} (it "
            f"reports {sorted(task._metric_fn_list)}); {fix}"
        )
    if not reported:
        raise DataError(
            f"{source.description}: lm-eval task {name!r} reports neither acc nor "
            f"acc_norm (it reports {sorted(task._metric_fn_list)}), which name its "
            "correct choice; add acc to its metric_list"
        )


def _set_num_fewshot(task: Any, num_fewshot: int | None) -> None:
    """``simple_evaluate``'s rule: a requested count replaces the task's own, except a task
    whose config says 0; without one, a task that sets none gets 0."""
    own = task.get_config("num_fewshot")
    if num_fewshot is not None and own != 0:
        task.set_config(key="num_fewshot", value=num_fewshot)
    elif own is None:
        task.set_config(key="num_fewshot", value=0)


def _correct_choice(task: Any, doc: dict[str, Any], requests: int, choices: int, where: str) -> int:
    """The one choice that ``process_results`` scores 1 when it is the likeliest (acc, or
    acc_norm for a task that reports only that: with every other choice at -1 and this one
    at 0, it is the argmax of the sums and of the sums per character alike)."""
    metric = "acc" if "acc" in task._metric_fn_list else "acc_norm"
    correct = []
    for k in range(choices):
        results = [(0.0 if j == k else -1.0, False) for j in range(requests)]
        if task.process_results(doc, results)[metric] == 1.0:
            correct.append(k)
    if len(correct) != 1:
        raise DataError(
            f"{where}: {len(correct)} of its {choices} choices count as correct for "
            f"lm-eval's {metric} (its doc_to_target names none of them, or several); "
            "one correct choice is supported"
        )
    return correct[0]


def _task_rows(task: Any, name: str, source: DataSource) -> list[dict[str, Any]]:
    """One row per document of one task, from the requests ``build_all_requests`` made."""
    by_doc: dict[int, list[Any]] = {}
    for instance in task.instances:
        by_doc.setdefault(instance.doc_id, []).append(instance)
    rows = []
    for doc_id, instances in sorted(by_doc.items()):
        instances.sort(key=lambda instance: instance.idx)
        doc = instances[0].doc
        # acc_mutual_info adds unconditional requests after the K choices; acc reads the first K.
        choices = task.doc_to_choice(doc)
        pairs = [instance.args[:2] for instance in instances[: len(choices)]]
        where = f"{source.description}, task {name}, document {doc_id}"
        rows.append(
            {
                "contexts": [context for context, _ in pairs],
                "continuations": [continuation for _, continuation in pairs],
                "answer": _correct_choice(task, doc, len(instances), len(choices), where),
                # acc_norm divides by the choice's length in characters (process_results).
                "choice_lengths": [len(choice) for choice in choices],
                "task": name,
                "doc_id": doc_id,
            }
        )
    return rows


def task_rows(source: DataSource) -> datasets.Dataset:
    """The rows of ``source.lm_eval_task`` (see the module docstring)."""
    _lm_eval()  # lm-eval is installed, or the error says how to install it
    with seeded_as_simple_evaluate():
        tasks = load_tasks(source)
        rows = []
        for name, task in tasks.items():
            task.build_all_requests(
                system_instruction=source.lm_eval_system_instruction,
                apply_chat_template=source.lm_eval_apply_chat_template,
                fewshot_as_multiturn=source.lm_eval_fewshot_as_multiturn,
                chat_template=_chat_to_render if source.lm_eval_apply_chat_template else None,
            )
            rows += _task_rows(task, name, source)
    if not rows:
        raise DataError(
            f"{source.description}: lm-eval task {source.lm_eval_task!r} has no documents"
        )
    logger.info(
        "%s: %d documents of lm-eval task %s (%d task(s))",
        source.description,
        len(rows),
        source.lm_eval_task,
        len(tasks),
    )
    return datasets.Dataset.from_list(rows)


def _chat_to_render(chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The ``chat_template`` lm-eval's task calls with a context's chat: the chat itself, as
    JSON, for ``render_chats`` to render with the run's tokenizer once there is one (rows are
    built before the tokenizer is known)."""
    return json.dumps({"messages": chat_history, "add_generation_prompt": add_generation_prompt})


def render_chats(tokenizer: PreTrainedTokenizerBase, contexts: Sequence[str]) -> list[str]:
    """Each context of rows built with ``lm_eval_apply_chat_template`` (a chat, as JSON)
    rendered by lm-eval's ``HFLM.apply_chat_template`` with ``tokenizer``'s chat template."""
    encoder = _pair_encoder(tokenizer)
    chats = [json.loads(context) for context in contexts]
    return [
        encoder.apply_chat_template(chat["messages"], chat["add_generation_prompt"])
        for chat in chats
    ]


def encode_pairs(
    tokenizer: PreTrainedTokenizerBase, contexts: Sequence[str], continuations: Sequence[str]
) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) of each pair, by lm-eval's ``hf`` model's own code."""
    requests = [SimpleNamespace(args=pair) for pair in zip(contexts, continuations, strict=True)]
    encoded: list[tuple[list[int], list[int]]] = _pair_encoder(tokenizer).loglikelihood(
        requests, disable_tqdm=True
    )
    return encoded


def _pair_encoder(tokenizer: PreTrainedTokenizerBase) -> Any:
    """lm-eval's ``HFLM``, built by its own ``__init__`` (so every setting it derives for the
    tokenizer, the BOS token, the prefix token, the pad token, is lm-eval's), around a
    weightless placeholder model on the meta device: encoding needs no weights. Its
    ``loglikelihood`` encodes the requests and hands them to ``_loglikelihood_tokens``,
    which here returns them instead of scoring. ``HFLM`` configures the tokenizer it is
    given (a pad token), so it gets a copy."""
    import torch
    from lm_eval.models.huggingface import HFLM
    from transformers import LlamaConfig, LlamaForCausalLM

    class PairEncoder(HFLM):
        def _loglikelihood_tokens(
            self, requests: Any, disable_tqdm: bool = False, override_bs: Any = None
        ) -> Any:
            return [(list(context), list(continuation)) for _, context, continuation in requests]

    with torch.device("meta"):
        placeholder = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=len(tokenizer),
                hidden_size=4,
                intermediate_size=4,
                num_hidden_layers=1,
                num_attention_heads=1,
                num_key_value_heads=1,
            )
        )
    # HFLM warns that a model passed in skips accelerate's launch checks: true, and moot here.
    quiet = logging.getLogger("lm_eval.models.huggingface")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return PairEncoder(
            pretrained=placeholder,
            tokenizer=copy.deepcopy(tokenizer),
            backend="causal",
            batch_size=1,
        )
    finally:
        quiet.setLevel(level)

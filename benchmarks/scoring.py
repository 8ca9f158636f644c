"""Memory and time of scoring multiple-choice questions: logits at the scored positions only,
against the logits at every position.

An accuracy domain is scored by the letter after each prompt (one position per question)
or, for lm-evaluation-harness tasks, by each choice's continuation (a few positions per
row). ``dynamics.engine.continuations.logits_at`` projects only those positions' hidden
states onto the vocabulary; a model whose forward does not take ``logits_to_keep`` gets
every position's logits, which is what this script compares against (the same model
behind a wrapper that hides the argument).

Reports, for each way of scoring, the bytes of the logits the model returns (read from the
output projection, exact), the median seconds of one scoring (the two alternate, and
every ratio is between medians of this run) and, on a GPU, the peak memory. The scores of
the two must agree (``max_abs_difference``).

    .venv/bin/python benchmarks/scoring.py            # Qwen2.5-0.5B's vocabulary, 2 layers
    .venv/bin/python benchmarks/scoring.py --layers 24 --questions 18 --length 300

The model is the named shape of ``benchmarks/shapes.py`` from random weights, with
``--layers`` layers (the projection onto the vocabulary does not depend on them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from dynamics.data.formatting import IGNORE_INDEX
from dynamics.engine.continuations import continuation_scores
from dynamics.engine.losses import choice_logits
from shapes import SHAPES


class EveryLogit(nn.Module):
    """The model behind a forward that takes ids and mask only, so it returns every logit."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)


def batches(
    vocab: int, questions: int, length: int, choices: int, device: torch.device
) -> tuple[dict, dict]:
    """A letter batch of ``questions`` right-padded prompts, and a continuation batch of
    ``questions * choices`` rows whose last 1-8 tokens are scored."""
    generator = torch.Generator().manual_seed(0)

    def rows(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(3, vocab, (count, length), generator=generator)
        lengths = torch.randint(length // 2, length + 1, (count,), generator=generator)
        mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
        return ids * mask, mask

    ids, mask = rows(questions)
    letters = {
        "input_ids": ids,
        "attention_mask": mask,
        "choice_token_ids": torch.randint(3, vocab, (questions, choices), generator=generator),
        "answer_index": torch.zeros(questions, dtype=torch.long),
    }
    ids, mask = rows(questions * choices)
    ends = mask.sum(dim=1)
    continuation = torch.randint(1, 9, (len(ids),), generator=generator)
    positions = torch.arange(length)[None, :]
    scored = (positions < ends[:, None]) & (positions >= (ends - continuation)[:, None])
    continuations = {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": ids.masked_fill(~scored, IGNORE_INDEX),
        "choice_rows": torch.arange(len(ids)).reshape(questions, choices),
        "score_divisors": torch.ones(questions, choices),  # acc: summed log-likelihoods
        "answer_index": torch.zeros(questions, dtype=torch.long),
    }
    move = lambda batch: {k: v.to(device) for k, v in batch.items()}  # noqa: E731
    return move(letters), move(continuations)


def measure(score: Callable, model: nn.Module, head: nn.Module, batch: dict, repeats: int) -> dict:
    logits_bytes: list[int] = []
    handle = head.register_forward_hook(
        lambda module, inputs, output: logits_bytes.append(output.numel() * output.element_size())
    )
    seconds = []
    try:
        with torch.no_grad():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            for _ in range(repeats):
                started = time.perf_counter()
                scores = score(model, batch)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                seconds.append(time.perf_counter() - started)
    finally:
        handle.remove()
    return {
        "scores": scores,
        "logits_bytes": logits_bytes[-1],
        "seconds": statistics.median(seconds),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30
        if torch.cuda.is_available()
        else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--questions", type=int, default=18, help="questions per batch")
    parser.add_argument("--choices", type=int, default=4)
    parser.add_argument("--length", type=int, default=256, help="tokens per padded row")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    shape = {**SHAPES[args.shape], "num_hidden_layers": args.layers}
    config = AutoConfig.for_model(**shape)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_config(config).to(device).eval()
    head = model.get_output_embeddings()
    letters, continuations = batches(
        config.vocab_size, args.questions, args.length, args.choices, device
    )
    report: dict = {
        "shape": args.shape,
        "layers": args.layers,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "vocab_size": config.vocab_size,
        "arguments": vars(args),
    }
    for name, score, batch in [
        ("letter", choice_logits, letters),
        ("continuation", continuation_scores, continuations),
    ]:
        results = {}
        # Alternate, so that a slow stretch of a shared machine falls on both.
        for _ in range(2):
            for way, scored_model in [
                ("scored_positions", model),
                ("every_position", EveryLogit(model)),
            ]:
                results[way] = measure(score, scored_model, head, batch, args.repeats)
        kept, every = results["scored_positions"], results["every_position"]
        finite = torch.isfinite(every["scores"])
        report[name] = {
            "rows": int(batch["input_ids"].shape[0]),
            "length": args.length,
            "logits_bytes": {way: r["logits_bytes"] for way, r in results.items()},
            "logits_bytes_ratio": kept["logits_bytes"] / every["logits_bytes"],
            "seconds": {way: r["seconds"] for way, r in results.items()},
            "time_ratio": kept["seconds"] / every["seconds"],
            "peak_memory_gib": {way: r["peak_memory_gib"] for way, r in results.items()},
            "max_abs_difference": float(
                (kept["scores"][finite] - every["scores"][finite]).abs().max()
            ),
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

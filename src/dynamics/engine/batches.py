"""Batch collation and the fixed evaluation batches of one domain.

Public API:

- ``collate_lm(examples, pad_id) -> dict``: ``input_ids`` (B, T) long, ``attention_mask``
  (B, T) long and ``labels`` (B, T) long, right-padded to the longest example, with ``-100``
  on the positions without loss and on the padding; blocks packed per document get
  ``position_ids`` (B, T) instead of the mask. ``model_inputs(batch)``: what the model's
  forward takes of it.
- ``collate_choice(examples, pad_id) -> dict``: ``input_ids``, ``attention_mask`` (B, T)
  right-padded, so the scoring position of row b is ``attention_mask[b].sum() - 1``;
  ``choice_token_ids`` (B, K) long and ``answer_index`` (B,) long. Questions with fewer than
  K choices repeat their first letter's id in the spare columns: a repeated id never
  changes a letter-restricted argmax (``torch.argmax`` returns the first maximum), so
  ``choice_token_ids`` can be gathered from the logits and argmaxed as is.
- ``EvalBatches``: one evaluation domain: its ``name``, ``metric`` (``"loss"`` or
  ``"accuracy"``) and fixed ``eval_batches`` / ``test_batches``, built once from a seed by
  ``EvalBatches.build``. It satisfies the learner's ``EvaluationDomain`` protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from dynamics.data.formatting import IGNORE_INDEX, ChoiceExample, LMExample
from dynamics.engine.continuations import collate_continuations

Batch = dict[str, torch.Tensor]
Metric = Literal["loss", "accuracy"]


def _right_pad(rows: Sequence[np.ndarray], value: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) int64 array of ``rows`` padded with ``value``, and its attention mask."""
    if not rows:
        raise ValueError("cannot collate an empty batch")
    width = max(len(r) for r in rows)
    values = np.full((len(rows), width), value, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for b, row in enumerate(rows):
        values[b, : len(row)] = row
        mask[b, : len(row)] = 1
    return torch.from_numpy(values), torch.from_numpy(mask)


def collate_lm(examples: Sequence[LMExample], pad_id: int) -> Batch:
    """Right-padded language-modelling batch; padding gets ``pad_id`` and label -100.

    Blocks packed per document carry ``position_ids`` instead of an ``attention_mask``:
    given positions and no mask, transformers keeps attention within each run of
    consecutive positions (each document; each padding token on its own)."""
    input_ids, attention_mask = _right_pad([e.input_ids for e in examples], pad_id)
    labels, _ = _right_pad([e.labels for e in examples], IGNORE_INDEX)
    positions = [e.position_ids for e in examples]
    if all(p is not None for p in positions):
        position_ids, _ = _right_pad([p for p in positions if p is not None], 0)
        return {"input_ids": input_ids, "position_ids": position_ids, "labels": labels}
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def model_inputs(batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The inputs a causal LM's forward takes from a language-modelling batch, and
    ``use_cache=False``: training never reads a key-value cache, and with one transformers
    ignores the positions of a block packed per document (its documents would attend to
    each other)."""
    inputs: dict[str, Any] = {
        k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch
    }
    inputs["use_cache"] = False
    return inputs


def collate_choice(examples: Sequence[ChoiceExample], pad_id: int) -> Batch:
    """Right-padded multiple-choice batch (see the module docstring for the choice columns);
    questions of an lm-eval task are collated by ``continuations.collate_continuations``."""
    if examples[0].sequence_lengths is not None:
        return collate_continuations(examples, pad_id)
    input_ids, attention_mask = _right_pad([e.input_ids for e in examples], pad_id)
    num_choices = max(len(e.choice_token_ids) for e in examples)
    choices = np.empty((len(examples), num_choices), dtype=np.int64)
    for b, example in enumerate(examples):
        ids = example.choice_token_ids
        choices[b] = ids[0]
        choices[b, : len(ids)] = ids
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "choice_token_ids": torch.from_numpy(choices),
        "answer_index": torch.tensor([e.answer_index for e in examples], dtype=torch.long),
    }


def _fixed_batches(
    examples: Sequence[LMExample] | Sequence[ChoiceExample],
    *,
    num_batches: int,
    batch_size: int,
    pad_id: int,
    rng: np.random.Generator,
) -> tuple[Batch, ...]:
    """``num_batches`` batches from ``examples`` in a seeded order. Fewer examples than
    ``num_batches * batch_size`` are cycled, each pass in a fresh order, so every example
    is used equally often (within one)."""
    needed = num_batches * batch_size
    order: list[int] = []
    while len(order) < needed:
        order.extend(int(i) for i in rng.permutation(len(examples)))
    collate: Callable[[Sequence[Any], int], Batch] = (
        collate_choice if isinstance(examples[0], ChoiceExample) else collate_lm
    )
    return tuple(
        collate([examples[i] for i in order[b * batch_size : (b + 1) * batch_size]], pad_id)
        for b in range(num_batches)
    )


@dataclass(frozen=True)
class EvalBatches:
    """The fixed evaluation and test batches of one evaluation domain.

    Built once per run and never reshuffled: every evaluation of the run sees the same
    batches, and the reduced evaluation used by probes is the first ``R`` batches of the
    main one (docs/method.md, "Same batches, same estimator").
    """

    name: str
    metric: Metric
    """``loss`` (mean token loss of ``collate_lm`` batches) or ``accuracy`` (letter-restricted
    argmax of ``collate_choice`` batches), from the examples' type."""
    eval_batches: tuple[Batch, ...]
    test_batches: tuple[Batch, ...]

    @classmethod
    def build(
        cls,
        name: str,
        eval_examples: Sequence[LMExample] | Sequence[ChoiceExample],
        test_examples: Sequence[LMExample] | Sequence[ChoiceExample],
        *,
        num_batches: int,
        batch_size: int,
        pad_id: int,
        seed: int,
    ) -> EvalBatches:
        """``num_batches`` batches of ``batch_size`` for each split; a split with more
        examples than that uses a seeded subset, one with fewer cycles its examples."""
        if num_batches < 1 or batch_size < 1:
            raise ValueError(
                f"num_batches={num_batches}, batch_size={batch_size}: both must be >= 1"
            )
        kinds = {type(e) for e in [*eval_examples, *test_examples]}
        if not eval_examples or not test_examples:
            raise ValueError(
                f"evaluation domain {name!r} needs eval and test examples, got "
                f"{len(eval_examples)} "
                f"and {len(test_examples)}; raise the source's eval_size/test_size"
            )
        if len(kinds) != 1:
            raise ValueError(
                f"eval and test examples mix kinds {sorted(k.__name__ for k in kinds)}"
            )
        metric: Metric = "accuracy" if kinds == {ChoiceExample} else "loss"
        # One stream of seeds per split, so the eval batches do not depend on the test set.
        eval_rng, test_rng = (np.random.default_rng([seed, part]) for part in (0, 1))
        sizes = {"num_batches": num_batches, "batch_size": batch_size, "pad_id": pad_id}
        return cls(
            name=name,
            metric=metric,
            eval_batches=_fixed_batches(eval_examples, rng=eval_rng, **sizes),
            test_batches=_fixed_batches(test_examples, rng=test_rng, **sizes),
        )

    def batches(self, split: str, num_batches: int | None = None) -> tuple[Batch, ...]:
        """The first ``num_batches`` batches (all when None) of ``split`` (``eval``/``test``)."""
        if split not in ("eval", "test"):
            raise ValueError(f"split={split!r}: use 'eval' or 'test'")
        chosen = self.eval_batches if split == "eval" else self.test_batches
        if num_batches is None:
            return chosen
        if not 1 <= num_batches <= len(chosen):
            raise ValueError(f"num_batches={num_batches} outside [1, {len(chosen)}]")
        return chosen[:num_batches]

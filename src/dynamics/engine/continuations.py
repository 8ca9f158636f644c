"""Multiple-choice questions scored by continuation, as lm-evaluation-harness scores ``acc``.

A question of an lm-eval task (a ``ChoiceExample`` with ``sequence_lengths``) is K token
sequences, a context followed by one choice's continuation each. lm-eval's ``acc`` picks
the choice whose continuation tokens have the largest summed log-likelihood
(``np.argmax`` of the per-choice sums, so the first of equal ones); the scores here are
those sums, and the learner's argmax over them (``torch.argmax`` also returns the first
maximum) is lm-eval's prediction.

Public API:

- ``collate_continuations(examples, pad_id) -> dict``: the batch's choice sequences as
  rows: ``input_ids``, ``attention_mask`` and ``labels`` (R, T), right-padded, the labels
  ``-100`` except on each row's continuation; ``choice_rows`` (B, K) long, the row of each
  question's choice k (-1 where a question has fewer than K choices); ``answer_index`` (B,);
  ``score_divisors`` (B, K) float32, each choice's ``ChoiceExample.score_divisors`` (1 where
  none: ``acc``; the choice's length in characters: ``acc_norm``).
- ``continuation_scores(model, batch) -> Tensor``: (B, K) summed log-likelihood of each
  choice's continuation divided by its score divisor (float32; ``-inf`` for the missing
  choices), so the argmax is lm-eval's ``acc`` or ``acc_norm`` prediction.
- ``logits_at(model, input_ids, attention_mask, positions) -> Tensor``: the logits at the
  given positions only, not at every position of every row.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dynamics.data.formatting import IGNORE_INDEX, ChoiceExample


def collate_continuations(examples: Sequence[ChoiceExample], pad_id: int) -> dict[str, Tensor]:
    """Right-padded rows of every choice of every question (see the module docstring)."""
    sequences: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    width = max(len(e.sequence_lengths) for e in examples if e.sequence_lengths is not None)
    choice_rows = np.full((len(examples), width), -1, dtype=np.int64)
    divisors = np.ones((len(examples), width), dtype=np.float32)
    for b, example in enumerate(examples):
        if example.sequence_lengths is None or example.continuation_lengths is None:
            raise ValueError("a batch mixes questions scored by letter and by continuation")
        ends = np.cumsum(example.sequence_lengths)
        if example.score_divisors is not None:
            divisors[b, : len(example.score_divisors)] = example.score_divisors
        for k, (end, length, continuation) in enumerate(
            zip(ends, example.sequence_lengths, example.continuation_lengths, strict=True)
        ):
            ids = example.input_ids[end - length : end]
            label = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
            label[len(ids) - continuation :] = ids[len(ids) - continuation :]
            choice_rows[b, k] = len(sequences)
            sequences.append(ids)
            labels.append(label)
    longest = max(len(ids) for ids in sequences)
    input_ids = np.full((len(sequences), longest), pad_id, dtype=np.int64)
    padded_labels = np.full((len(sequences), longest), IGNORE_INDEX, dtype=np.int64)
    mask = np.zeros((len(sequences), longest), dtype=np.int64)
    for r, (ids, label) in enumerate(zip(sequences, labels, strict=True)):
        input_ids[r, : len(ids)] = ids
        padded_labels[r, : len(ids)] = label
        mask[r, : len(ids)] = 1
    return {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(mask),
        "labels": torch.from_numpy(padded_labels),
        "choice_rows": torch.from_numpy(choice_rows),
        "answer_index": torch.tensor([e.answer_index for e in examples], dtype=torch.long),
        "score_divisors": torch.from_numpy(divisors),
    }


def at_least_float32(tensor: Tensor) -> Tensor:
    """``tensor`` in float32 when it is computed in a narrower float (bf16, fp16), as it is
    in float64: losses and scores are reduced in at least single precision."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def logits_at(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, positions: Tensor
) -> Tensor:
    """The model's logits at ``positions`` only: an integer (B, P) tensor gives (B, P, V),
    a boolean (B, T) mask gives (N, V) for its N true positions in row-major order.

    Scoring reads a few positions per row, and the full (B, T, V) logits of a model with a
    large vocabulary are most of an evaluation's memory (72 rows of 300 tokens over a
    49,152-token vocabulary hold 4 GiB in float32). A causal LM of transformers' own that
    takes ``logits_to_keep`` projects only the kept hidden states onto the vocabulary; any
    other model (a few transformers classes, code loaded with ``trust_remote_code``, whose
    ``logits_to_keep`` may take an int only) computes every logit, and the kept ones are
    read from them."""
    if _takes_logits_to_keep(model):
        return model(
            input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=positions
        ).logits
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    if positions.dtype == torch.bool:
        return logits[positions]
    return torch.take_along_dim(logits, positions[..., None], dim=1)


def _takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether ``model`` (under a PEFT wrapper, its base model) is a transformers model
    class whose forward takes ``logits_to_keep`` (transformers' own slicing takes tensors of
    positions and masks)."""
    get_base_model = getattr(model, "get_base_model", None)
    base = get_base_model() if callable(get_base_model) else model
    own = type(base).__module__.startswith("transformers.models.")
    return own and "logits_to_keep" in inspect.signature(base.forward).parameters


def continuation_scores(model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
    """(B, K) summed log-likelihood of each choice's continuation tokens over its score
    divisor (-inf where a question has no choice k)."""
    labels = batch["labels"]
    # The logits at position t score token t + 1: keep the positions before each
    # continuation token.
    scored = labels[:, 1:] != IGNORE_INDEX
    keep = F.pad(scored, (0, 1), value=False)
    logits = logits_at(model, batch["input_ids"], batch["attention_mask"], keep)  # (N, V)
    log_probs = F.log_softmax(at_least_float32(logits), dim=-1)
    token_scores = log_probs.gather(1, labels[:, 1:][scored][:, None]).squeeze(1)
    # Summed row by row in a fixed order (index_add_ is not deterministic on a GPU).
    row_scores = torch.zeros(scored.shape, dtype=token_scores.dtype, device=token_scores.device)
    row_scores = row_scores.masked_scatter(scored, token_scores).sum(dim=1)
    rows = batch["choice_rows"]
    scores = row_scores[rows.clamp(min=0)] / batch["score_divisors"]
    return torch.where(rows >= 0, scores, torch.full_like(scores, -torch.inf))

"""The examples the data layer hands to training and evaluation: ``LMExample`` (a document's
tokens and loss labels) and ``ChoiceExample`` (one multiple-choice question)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100
"""Label of a position without loss (the value Hugging Face models ignore)."""


@dataclass(frozen=True, eq=False)
class LMExample:
    """A language-modelling example; ``labels[t] = -100`` where no loss is taken.

    Labels are *not* shifted: the model predicts ``labels[t + 1]`` from position ``t``.
    """

    input_ids: np.ndarray  # int32, shape (T,)
    labels: np.ndarray  # int32, shape (T,)
    position_ids: np.ndarray | None = None
    """Per-document positions of a ``packing="per-document"`` block (None otherwise)."""

    def __post_init__(self) -> None:
        if self.input_ids.shape != self.labels.shape or self.input_ids.ndim != 1:
            raise ValueError(
                f"input_ids {self.input_ids.shape} and labels {self.labels.shape} must be equal 1-d"
            )
        if self.position_ids is not None and self.position_ids.shape != self.input_ids.shape:
            raise ValueError(
                f"position_ids {self.position_ids.shape} must match "
                f"input_ids {self.input_ids.shape}"
            )

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True, eq=False)
class ChoiceExample:
    """A multiple-choice question: the prediction is the argmax of the next-token logits
    after the last prompt token, restricted to ``choice_token_ids`` (one letter per choice).

    A question of an lm-eval task (``sequence_lengths`` set) is scored by continuation, as
    lm-eval's ``acc``: ``input_ids`` holds its K choices' token sequences (context and
    continuation) one after another, ``sequence_lengths`` their lengths and
    ``continuation_lengths`` how many tokens at the end of each are the continuation; the
    prediction is the choice whose continuation tokens have the largest summed
    log-likelihood (divided by ``score_divisors``, each choice's length in characters, for
    lm-eval's ``acc_norm``), and ``choice_token_ids`` is empty."""

    input_ids: np.ndarray  # int32, shape (T,)
    choice_token_ids: np.ndarray  # int32, shape (K,)
    answer_index: int
    sequence_lengths: np.ndarray | None = None  # int32, shape (K,)
    continuation_lengths: np.ndarray | None = None  # int32, shape (K,)
    score_divisors: np.ndarray | None = None  # float32, shape (K,); None divides by 1

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


Example = LMExample | ChoiceExample

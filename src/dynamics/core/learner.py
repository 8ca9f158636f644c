"""The small protocol the controller is written against.

The Hugging Face engine implements it for real models; the tests implement it with an
analytic toy whose slopes are known in closed form.

Every metric is "lower is better": a loss, or the negative accuracy of a multiple-choice
domain, so that "not worse than the base model" is always ``value <= reference``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Evaluation:
    """Per-domain, per-batch metric values of one evaluation pass.

    ``per_batch[i, b]`` is the metric of evaluation domain ``i`` on its fixed batch ``b``.
    The reduced evaluation used by probes is the first ``num_batches`` batches of the
    main evaluation, so an anchor recycled from the main evaluation is the mean over
    exactly the batches the probe will see (docs/method.md, "Same batches, same estimator").
    """

    per_batch: np.ndarray  # shape (M, B)
    expected: np.ndarray | None = None
    """The same values with each accuracy domain's accuracy replaced by its expected
    accuracy (negative): the mean probability the model gives the correct choice among the
    choices, which moves with training where no answer flips yet. None where the learner
    does not measure it."""

    def __post_init__(self) -> None:
        if self.per_batch.ndim != 2 or self.per_batch.shape[1] == 0:
            raise ValueError(
                f"per_batch must have shape (M, B) with B >= 1, got {self.per_batch.shape}"
            )
        if self.expected is not None and self.expected.shape != self.per_batch.shape:
            raise ValueError(
                f"expected must have the shape of per_batch {self.per_batch.shape}, got "
                f"{self.expected.shape}"
            )

    @property
    def num_batches(self) -> int:
        return int(self.per_batch.shape[1])

    def means(self, num_batches: int | None = None) -> np.ndarray:
        """Mean over the first ``num_batches`` batches (all when None), shape (M,)."""
        if num_batches is None:
            num_batches = self.num_batches
        if not 1 <= num_batches <= self.num_batches:
            raise ValueError(f"num_batches={num_batches} outside [1, {self.num_batches}]")
        return np.asarray(self.per_batch[:, :num_batches].mean(axis=1), dtype=float)

    def reduced(self, num_batches: int) -> Evaluation:
        """The evaluation on its first ``num_batches`` batches only (a probe's anchor)."""
        if not 1 <= num_batches <= self.num_batches:
            raise ValueError(f"num_batches={num_batches} outside [1, {self.num_batches}]")
        expected = None if self.expected is None else self.expected[:, :num_batches]
        return Evaluation(self.per_batch[:, :num_batches], expected)


@dataclass(frozen=True)
class DomainKind:
    """What an evaluation domain's values are, so that decisions respect their units.

    metric:      ``loss`` (nats, never below 0) or ``accuracy`` (stored as ``-accuracy``,
                 in [-1, 0]).
    batch_size:  examples one evaluation batch scores (an accuracy's binomial noise).
    """

    metric: Literal["loss", "accuracy"]
    batch_size: int

    def __post_init__(self) -> None:
        if self.metric not in ("loss", "accuracy"):
            raise ValueError(f"metric must be 'loss' or 'accuracy', got {self.metric!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


class Diverged(ArithmeticError):
    """A probe or a training step produced a non-finite loss or gradient. Raised by
    ``Learner.probe`` (the policy discards that probe), and by ``Learner.train`` once the
    run has skipped more such steps than it may."""


@runtime_checkable
class Learner(Protocol):
    """What Algorithms 1 and 2 need from a model being fine-tuned."""

    @property
    def dataset_names(self) -> Sequence[str]:
        """The N fine-tuning datasets, in the order of the weight vector."""
        ...

    @property
    def domain_names(self) -> Sequence[str]:
        """The M evaluation domains, in the order of the slope matrix rows."""
        ...

    @property
    def domain_kinds(self) -> Sequence[DomainKind]:
        """The metric and evaluation batch size of each of the M domains."""
        ...

    def evaluate(self, split: str, num_batches: int | None = None) -> Evaluation:
        """Evaluate every domain on the first ``num_batches`` fixed batches of ``split``
        (``"eval"`` or ``"test"``; all batches when None). Must not change training state."""
        ...

    def train(self, steps: int, weights: np.ndarray) -> None:
        """Take ``steps`` optimizer steps, each batch drawn from dataset j with the batch share
        of ``weights`` in the run's unit (:mod:`dynamics.core.shares`): w_j itself by batches."""
        ...

    def probe(self, steps: int, dataset: int) -> None:
        """Algorithm 1's probe: ``steps`` optimizer steps on dataset ``dataset`` alone, with
        the run's own optimizer; rolled back afterwards by ``restore``. Raises
        :class:`Diverged` at a non-finite loss (the caller restores and discards it)."""
        ...

    def snapshot(self) -> Any:
        """Everything a probe may change: trainable parameters, optimizer state, LR scheduler,
        RNG and sampler state (in memory)."""
        ...

    def restore(self, snapshot: Any) -> None:
        """Return exactly to the state captured by ``snapshot``; the snapshot stays valid."""
        ...


@runtime_checkable
class AlignmentLearner(Learner, Protocol):
    """A learner that can also supply gradient-alignment slopes (paper appendix K)."""

    def alignment_slopes(self, num_batches: int) -> np.ndarray:
        """``S_ij = -lr * <g_i, d_j>`` with g_i the mean gradient of domain i and d_j the
        bias-corrected Adam direction of dataset j, each averaged over ``num_batches``
        batches; shape (M, N). Must not change training state."""
        ...

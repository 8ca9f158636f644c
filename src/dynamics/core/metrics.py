"""The paper's metrics, computed from saved evaluation records.

Section 4.5 and the appendices "Feasibility Rates" and "Constraint Violation in Infeasible
Scenarios".

Records are plain data: one record per evaluation step of a run (an :class:`EvalPoint`,
or anything with the same ``step``, ``eval`` and ``test`` fields, such as the controller's
evaluation records), with the metric of every evaluation domain on the evaluation split
(used to *select* checkpoints) and on the held-out test split (used to *report* them).
Every metric is "lower is better": a loss in nats, or the negative accuracy of a
multiple-choice domain, so an accuracy constraint is the same ``value <= reference`` as a
loss constraint. The step-0 record is the base model and gives every reference.

Targets are always losses (perplexity is ``exp(loss)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

SPLITS = ("eval", "test")

TIE_TOLERANCE = 1e-5
"""Two evaluations of a domain closer than this (nats, or a fraction of the questions) are
the same value: a constraint within it of its reference counts as held. The same model
evaluated on two machines or builds differs in the sixth or seventh digit (float32 sums
taken in another order); no loss moves by 1e-5 nats, and no accuracy by a thousandth of a
question out of a hundred, for a real reason."""


class Checkpoint(Protocol):
    """What the metrics read from an evaluation record."""

    @property
    def step(self) -> int: ...

    @property
    def eval(self) -> np.ndarray: ...

    @property
    def test(self) -> np.ndarray: ...


@dataclass(frozen=True)
class EvalPoint:
    """Metrics of every evaluation domain at one training step.

    step:  training step of the checkpoint (0 = base model).
    eval:  per-domain values on the evaluation split, shape (M,).
    test:  per-domain values on the held-out test split, shape (M,).
    eval_batches: per-domain, per-batch values on the evaluation split, shape (M, B), where
           the run recorded them (what :func:`change_standard_error` reads).
    """

    step: int
    eval: np.ndarray
    test: np.ndarray
    eval_batches: np.ndarray | None = None


PointT = TypeVar("PointT", bound=Checkpoint)


def split_values(point: Checkpoint, split: str) -> np.ndarray:
    """Per-domain values of ``split`` ("eval" or "test") at ``point``, shape (M,)."""
    if split == "eval":
        return np.asarray(point.eval, dtype=float)
    if split == "test":
        return np.asarray(point.test, dtype=float)
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def reference_point(points: Sequence[PointT]) -> PointT:
    """The step-0 record (the base model), which gives every reference value."""
    for point in points:
        if point.step == 0:
            return point
    raise ValueError("the run has no step-0 evaluation: references come from the base model")


def _after_step_zero(points: Sequence[PointT]) -> list[PointT]:
    # Feasibility is about what fine-tuning produced: the base model itself never counts.
    return [p for p in points if p.step > 0]


def checkpoint_feasible(
    point: Checkpoint,
    reference: Checkpoint,
    targets: Sequence[int],
    constraints: Sequence[int],
    split: str = "eval",
) -> bool:
    """Every constraint at or below its step-0 value (up to ``TIE_TOLERANCE``) AND the
    summed target loss strictly below step 0's (the model learned something without
    forgetting)."""
    values, ref = split_values(point, split), split_values(reference, split)
    t = list(targets)
    targets_improved = bool(values[t].sum() < ref[t].sum())
    return bool(constraints_held(point, reference, constraints, split).all()) and targets_improved


def constraints_held(
    point: Checkpoint,
    reference: Checkpoint,
    constraints: Sequence[int],
    split: str = "eval",
) -> np.ndarray:
    """Per constraint, whether it is at or below its reference (up to ``TIE_TOLERANCE``),
    shape (|C|,)."""
    return constraint_slack(point, reference, constraints, split) >= -TIE_TOLERANCE


def run_feasible(
    points: Sequence[Checkpoint],
    targets: Sequence[int],
    constraints: Sequence[int],
    split: str = "eval",
) -> bool:
    """Appendix "Feasibility Rates": some checkpoint after step 0 is feasible."""
    reference = reference_point(points)
    return any(
        checkpoint_feasible(p, reference, targets, constraints, split)
        for p in _after_step_zero(points)
    )


def change_standard_error(point: Checkpoint, reference: Checkpoint) -> np.ndarray:
    """Per domain, the standard error of ``point``'s eval value minus ``reference``'s, shape
    (M,): the two are scored on the same fixed batches, so the change is measured batch by
    batch, and its error is the sample standard deviation of the B per-batch changes over
    sqrt(B). An accuracy none of whose answers flipped has 0 (nothing changed to doubt).
    Batches that repeat examples (a split smaller than the batches hold) understate it.
    Needs the per-batch values (``eval_batches``) of both."""
    batches = [getattr(p, "eval_batches", None) for p in (point, reference)]
    if batches[0] is None or batches[1] is None:
        raise ValueError(
            f"the evaluations of steps {reference.step} and {point.step} have no per-batch values "
            "(eval_batches), which a selection margin needs: run again with this version to record "
            "them, "
            "or select with evaluation.selection_margin: 0"
        )
    change = np.asarray(batches[0], dtype=float) - np.asarray(batches[1], dtype=float)
    if change.shape[1] < 2:
        raise ValueError(
            "a standard error needs at least two eval batches per domain: raise evaluation.batches"
        )
    return np.asarray(change.std(axis=1, ddof=1) / np.sqrt(change.shape[1]))


def standardized_slack(
    point: Checkpoint, reference: Checkpoint, constraints: Sequence[int]
) -> np.ndarray:
    """Per constraint, its eval slack over the standard error of its change from the
    reference (:func:`change_standard_error`), shape (|C|,): how many errors it is inside
    (above 0) or beyond its reference. A constraint whose change has no error (no answer
    flipped) is +inf when held, -inf when broken."""
    slack = constraint_slack(point, reference, constraints, "eval")
    error = change_standard_error(point, reference)[list(constraints)]
    held = slack >= -TIE_TOLERANCE
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(error > 0, slack / error, np.where(held, np.inf, -np.inf))


def clears_margin(
    point: Checkpoint, reference: Checkpoint, constraints: Sequence[int], margin: float
) -> bool:
    """Whether every constraint's eval slack is at least ``margin`` standard errors of its
    change from the reference (:func:`change_standard_error`), up to ``TIE_TOLERANCE``;
    with ``margin`` 0, whether every constraint held."""
    if margin == 0:
        return bool(constraints_held(point, reference, constraints).all())
    slack = constraint_slack(point, reference, constraints, "eval")
    error = change_standard_error(point, reference)[list(constraints)]
    return bool((slack >= margin * error - TIE_TOLERANCE).all())


def selection_rank(
    point: Checkpoint,
    reference: Checkpoint,
    targets: Sequence[int],
    constraints: Sequence[int],
    margin: float,
) -> tuple[bool, float, float]:
    """How a feasible checkpoint ranks for selection, lower first: whether it falls short of
    the ``margin`` (never with ``margin`` 0); among those short of it, the least
    standardized slack of its constraints, greatest first (:func:`standardized_slack`);
    then its summed target loss on the eval split (:func:`best_feasible_checkpoint`)."""
    loss = float(split_values(point, "eval")[list(targets)].sum())
    if margin == 0 or clears_margin(point, reference, constraints, margin):
        return False, 0.0, loss
    return True, -float(standardized_slack(point, reference, constraints).min()), loss


def best_feasible_checkpoint(
    points: Sequence[PointT],
    targets: Sequence[int],
    constraints: Sequence[int],
    margin: float = 0.0,
) -> PointT | None:
    """The feasible checkpoint after step 0 with the lowest summed target loss, both judged
    on the evaluation split (the earliest one on ties); None when the run is infeasible.

    With a ``margin`` above 0, a chance constraint: the best of the feasible checkpoints
    whose every constraint clears its reference by ``margin`` standard errors of its change
    (:func:`clears_margin`); where none does, the feasible checkpoint whose closest
    constraint is the most standard errors inside its reference, the one most likely to
    hold on data it was not chosen on. Some target gain is given up for that."""
    reference = reference_point(points)
    feasible = [
        p
        for p in _after_step_zero(points)
        if checkpoint_feasible(p, reference, targets, constraints, "eval")
    ]
    if not feasible:
        return None
    return min(
        feasible,
        key=lambda p: (*selection_rank(p, reference, targets, constraints, margin), p.step),
    )


def perplexity_reduction(
    point: Checkpoint,
    reference: Checkpoint,
    targets: Sequence[int],
    split: str = "test",
) -> float:
    """Relative reduction of the geometric-mean target perplexity, as a fraction:
    ``1 - exp(mean_i L_i(t) - mean_i L_i(0))`` over target losses (0.2 = 20% lower)."""
    t = list(targets)
    if not t:
        raise ValueError("perplexity reduction needs at least one target domain")
    change = split_values(point, split)[t].mean() - split_values(reference, split)[t].mean()
    return float(-np.expm1(change))


def constrained_perplexity_reduction(
    points: Sequence[Checkpoint],
    targets: Sequence[int],
    constraints: Sequence[int],
    margin: float = 0.0,
) -> float:
    """Section 4.5: perplexity reduction on the TEST split at the best feasible checkpoint
    chosen on the EVAL split; 0.0 for an infeasible run (keep the base model).

    It can be negative: a checkpoint selected on eval may be worse than step 0 on test,
    and reporting that is the point of the held-out split. ``margin``: as in
    :func:`best_feasible_checkpoint`.
    """
    best = best_feasible_checkpoint(points, targets, constraints, margin)
    if best is None:
        return 0.0
    return perplexity_reduction(best, reference_point(points), targets, split="test")


def constraint_slack(
    point: Checkpoint,
    reference: Checkpoint,
    constraints: Sequence[int],
    split: str = "eval",
) -> np.ndarray:
    """``reference - value`` per constraint, in the metric's units (nats, or accuracy for
    accuracy domains), shape (|C|,): positive = room left, negative = violated."""
    c = list(constraints)
    return split_values(reference, split)[c] - split_values(point, split)[c]


def max_violation_closest_to_feasibility(
    points: Sequence[Checkpoint],
    constraints: Sequence[int],
    split: str = "eval",
) -> tuple[int, float]:
    """Appendix "Constraint Violation": the checkpoint after step 0 minimizing the
    worst-case constraint violation ``max_i (value_i - reference_i)``, as (step, violation).

    The violation is in the metric's units; it is negative when every constraint held with
    room to spare at that checkpoint (the run may still be infeasible if its target loss
    did not go down). Clip at 0 to plot violations only. The earliest step wins ties.
    """
    if not constraints:
        raise ValueError("the maximum constraint violation needs at least one constraint")
    reference = reference_point(points)
    candidates = _after_step_zero(points)
    if not candidates:
        raise ValueError("the run has no evaluation after step 0")
    violation, step = min(
        (-float(constraint_slack(p, reference, constraints, split).min()), p.step)
        for p in candidates
    )
    return step, violation


def best_at_k(pool: Sequence[float] | np.ndarray, k: int) -> float:
    """Expected best of ``k`` draws with replacement from a scenario's baseline pool.

    Exact, by order statistics: with the pool sorted, x_(1) <= ... <= x_(n), the maximum
    of k draws is at most x_(i) with probability (i/n)^k, so

        E[max] = x_(n) - sum_{i<n} (x_(i+1) - x_(i)) (i/n)^k.

    Every term is non-negative and shrinks with k, so the result is non-decreasing in k
    and never above the pool's maximum, also in floating point.
    """
    values = _check_pool(pool, k)
    n = values.size
    gaps = np.diff(values)
    below = (np.arange(1, n) / n) ** k
    return float(values[-1] - gaps @ below)


def chosen_at_k(
    selection: Sequence[float] | np.ndarray, reported: Sequence[float] | np.ndarray, k: float
) -> float:
    """Expected ``reported`` value of the run a user would keep from ``k`` draws with
    replacement from a baseline pool: the draw with the highest ``selection`` score (chosen
    on the eval split, reported on the test split). ``k`` may be fractional, for comparing
    at a method's measured cost (k = 2.4 runs).

    With the pool sorted by selection score (ties in pool order), the kept run is the i-th
    of n with probability (i/n)^k - ((i-1)/n)^k, the chance that all k draws rank at most i
    minus the chance that they all rank below it.
    """
    scores = np.asarray(selection, dtype=float).ravel()
    values = np.asarray(reported, dtype=float).ravel()
    if scores.shape != values.shape or scores.size == 0:
        raise ValueError("selection and reported need one finite value per run of a non-empty pool")
    if not (np.all(np.isfinite(scores)) and np.all(np.isfinite(values))):
        raise ValueError("selection and reported must hold finite numbers")
    if isinstance(k, bool) or not np.isfinite(k) or k < 1:
        raise ValueError(f"k must be a number of runs >= 1, got {k!r}")
    order = np.argsort(scores, kind="stable")
    n = scores.size
    ranks = np.arange(1, n + 1) / n
    chance = ranks**k - (ranks - 1 / n) ** k
    return float(values[order] @ chance)


def best_at_k_monte_carlo(
    pool: Sequence[float] | np.ndarray, k: int, rng: np.random.Generator, num_samples: int = 100_000
) -> float:
    """Monte Carlo estimate of :func:`best_at_k` from ``num_samples`` sets of k draws."""
    values = _check_pool(pool, k)
    draws = rng.choice(values, size=(num_samples, k), replace=True)
    return float(draws.max(axis=1).mean())


def feasible_at_k(pool: Sequence[bool] | np.ndarray, k: int) -> float:
    """Probability that at least one of ``k`` draws with replacement from a pool of
    baseline-run feasibilities is feasible: ``1 - (1 - p)^k`` with p the pool's rate."""
    flags = np.asarray(pool, dtype=bool)
    _check_pool(flags.astype(float), k)
    return float(1.0 - (1.0 - flags.mean()) ** k)


def prediction_errors(predicted: np.ndarray, realized: np.ndarray) -> np.ndarray:
    """Realized minus predicted per-domain metric at the next update, shape (M,):
    positive = the metric ended higher (worse) than the update predicted."""
    predicted = np.asarray(predicted, dtype=float)
    realized = np.asarray(realized, dtype=float)
    if predicted.shape != realized.shape:
        raise ValueError(
            f"predicted and realized must have the same shape, got {predicted.shape} and "
            f"{realized.shape}"
        )
    return realized - predicted


def _check_pool(pool: Sequence[float] | np.ndarray, k: int) -> np.ndarray:
    values = np.sort(np.asarray(pool, dtype=float).ravel())
    if values.size == 0:
        raise ValueError("the baseline pool is empty")
    if not np.all(np.isfinite(values)):
        raise ValueError("the baseline pool must hold finite numbers")
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer number of runs, got {k!r}")
    return values

"""Algorithm 1's probes, run in turn or shared out among processes.

Public API:

- ``ProbeRuns``: what probing one update measured: the reduced evaluation after each probe
  checkpoint of each dataset, each probe's wall time, and which process(es) ran it.
- ``probe_in_turn(learner, datasets, checkpoints, num_batches, snapshot)``: probe the
  given datasets one after another, each from ``snapshot`` (the paper's loop).
- ``ProbingLearner``: a learner that runs all the probes of an update itself, e.g. spread
  over several processes (``dynamics.engine.learner.HFLearner``).
- ``probe_datasets(learner, checkpoints, num_batches)``: all N probes of one update,
  through ``ProbingLearner.probe_all`` when the learner has it, else in turn; the learner
  is back at its starting state afterwards.
- ``measured_changes(anchor, runs, reliable, kinds, expected_accuracy)``: the anchor and
  the probes' evaluations that slopes are computed from.
- ``PerturbedEvaluations(learner, relative, seed)``: the learner with every evaluation,
  probes' included, multiplied by ``1 + relative N(0, 1)``, for sensitivity checks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dynamics.core.learner import Diverged, DomainKind, Evaluation, Learner


@dataclass(frozen=True)
class ProbeRuns:
    """The measurements of one update's probes.

    ``evaluations[j, k]`` is the reduced eval-split evaluation ``(M, R)`` after the
    ``k``-th checkpoint of dataset ``j``'s probe; all NaN for a probe that diverged.
    ``seconds[j]`` is the wall time of dataset ``j``'s probe (its steps and evaluations);
    ``ranks[j]`` the processes that ran it (``[0]`` in a single process). ``expected``
    holds the same evaluations with expected accuracies (:attr:`Evaluation.expected`), or
    None where the learner does not measure them.
    """

    evaluations: np.ndarray  # (N, K, M, R)
    seconds: np.ndarray  # (N,)
    ranks: list[list[int]]
    expected: np.ndarray | None = None  # (N, K, M, R)

    def __post_init__(self) -> None:
        if self.evaluations.ndim != 4:
            raise ValueError(
                f"evaluations must have shape (N, K, M, R), got {self.evaluations.shape}"
            )
        if self.expected is not None and self.expected.shape != self.evaluations.shape:
            raise ValueError(
                f"expected must have the shape of evaluations {self.evaluations.shape}"
            )
        if self.seconds.shape != self.evaluations.shape[:1] or len(self.ranks) != len(self.seconds):
            raise ValueError("seconds and ranks need one entry per probed dataset")

    def reliable(self) -> list[int]:
        """The datasets whose probe reached finite evaluations throughout."""
        finite = np.isfinite(self.evaluations).reshape(len(self.evaluations), -1).all(axis=1)
        return [int(j) for j in np.flatnonzero(finite)]


def probe_in_turn(
    learner: Learner,
    datasets: Sequence[int],
    checkpoints: Sequence[int],
    num_batches: int,
    snapshot: Any,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Probe each of ``datasets`` from ``snapshot``, evaluating ``num_batches`` reduced
    batches at every checkpoint (steps from the snapshot, increasing).

    Returns the evaluations ``(len(datasets), K, M, R)`` (NaN for a probe that raised
    :class:`Diverged`), the same with expected accuracies (None unless every evaluation
    had them) and each probe's wall seconds. The learner is left at the end of the last
    probe: the caller restores it.
    """
    num_domains = len(learner.domain_names)
    evaluations = np.full((len(datasets), len(checkpoints), num_domains, num_batches), np.nan)
    expected: np.ndarray | None = evaluations.copy()
    seconds = np.zeros(len(datasets))
    for row, j in enumerate(datasets):
        started = time.perf_counter()
        # Algorithm 1: every probe starts from the same parameters and optimizer state.
        learner.restore(snapshot)
        done = 0
        try:
            for k, checkpoint in enumerate(checkpoints):
                learner.probe(checkpoint - done, j)
                done = checkpoint
                evaluation = learner.evaluate("eval", num_batches)
                evaluations[row, k] = evaluation.per_batch
                if expected is not None and evaluation.expected is not None:
                    expected[row, k] = evaluation.expected
                else:
                    expected = None
        except Diverged:
            evaluations[row] = np.nan
        seconds[row] = time.perf_counter() - started
    return evaluations, expected, seconds


@runtime_checkable
class ProbingLearner(Learner, Protocol):
    """A learner that runs every probe of an update itself."""

    def probe_all(self, checkpoints: Sequence[int], num_batches: int) -> ProbeRuns:
        """Probe every dataset from the current state (as :func:`probe_in_turn` does) and
        return to that state afterwards; every process gets the same ``ProbeRuns``."""
        ...


def probe_datasets(learner: Learner, checkpoints: Sequence[int], num_batches: int) -> ProbeRuns:
    """All probes of one update; the learner ends where it started."""
    if isinstance(learner, ProbingLearner):
        return learner.probe_all(checkpoints, num_batches)
    snapshot = learner.snapshot()
    datasets = range(len(learner.dataset_names))
    evaluations, expected, seconds = probe_in_turn(
        learner, datasets, checkpoints, num_batches, snapshot
    )
    learner.restore(snapshot)
    return ProbeRuns(evaluations, seconds, [[0] for _ in datasets], expected)


def measured_changes(
    anchor: Evaluation,
    runs: ProbeRuns,
    reliable: Sequence[int],
    kinds: Sequence[DomainKind],
    expected_accuracy: bool,
) -> tuple[np.ndarray, np.ndarray, str | None]:
    """The anchor's per-batch values ``(M, R)`` and the reliable probes' evaluations
    ``(len(reliable), K, M, R)`` whose changes are the slopes, and what the accuracy
    domains' rows were read from, for the record: ``"expected"``, a sentence saying the
    learner reports no expected accuracy, or None without ``expected_accuracy`` or without
    an accuracy domain.

    With ``expected_accuracy`` each accuracy domain's rows are its expected accuracy, on
    the anchor and on every probe, so that its slope is the change of the probability of
    the correct answers: a short probe moves it where no answer flips yet, and an
    accuracy's slope read from flipped answers is then zero or one answer's worth. The
    predicted accuracy is still the measured one plus the horizon times that slope.
    Without an accuracy domain, or from a learner whose evaluations do not report expected
    accuracies, the measured values are used.
    """
    num_batches = runs.evaluations.shape[-1]
    base, probed = anchor.per_batch[:, :num_batches], runs.evaluations[list(reliable)]
    accuracies = [i for i, kind in enumerate(kinds) if kind.metric == "accuracy"]
    if not (expected_accuracy and accuracies):
        return base, probed, None
    if anchor.expected is None or runs.expected is None:
        return base, probed, "measured: the learner reports no expected accuracy"
    base, probed = base.copy(), probed.copy()
    base[accuracies] = anchor.expected[accuracies, :num_batches]
    probed[:, :, accuracies] = runs.expected[list(reliable)][:, :, accuracies]
    return base, probed, "expected"


class PerturbedEvaluations:
    """A learner whose evaluations are multiplied by ``1 + relative N(0, 1)``, one draw per
    value, for sensitivity checks: how far do a run's decisions move under a perturbation
    the size of what separates two machines or two builds (``relative`` ~ 1e-6)?

    Everything else is the wrapped learner's (attributes are looked up on it). The draws
    come from one generator seeded with ``seed``, in evaluation order, so a run is
    repeatable; a resumed run draws anew from its start.
    """

    def __init__(self, learner: Learner, relative: float, seed: int = 0) -> None:
        if not (relative > 0 and np.isfinite(relative)):
            raise ValueError(f"relative must be a positive number, got {relative}")
        self.learner = learner
        self.relative = relative
        self._rng = np.random.default_rng(seed)

    def evaluate(self, split: str, num_batches: int | None = None) -> Evaluation:
        """The wrapped learner's evaluation, each value times its own draw (an expected
        accuracy times its accuracy's)."""
        evaluation = self.learner.evaluate(split, num_batches)
        factor = 1.0 + self.relative * self._rng.standard_normal(evaluation.per_batch.shape)
        expected = None if evaluation.expected is None else evaluation.expected * factor
        return Evaluation(evaluation.per_batch * factor, expected)

    def probe_all(self, checkpoints: Sequence[int], num_batches: int) -> ProbeRuns:
        """The wrapped learner's probes, their evaluations perturbed like any other."""
        if isinstance(self.learner, ProbingLearner):
            runs = self.learner.probe_all(checkpoints, num_batches)
            factor = 1.0 + self.relative * self._rng.standard_normal(runs.evaluations.shape)
            expected = None if runs.expected is None else runs.expected * factor
            return ProbeRuns(runs.evaluations * factor, runs.seconds, runs.ranks, expected)
        snapshot = self.learner.snapshot()
        datasets = range(len(self.learner.dataset_names))
        evaluations, expected, seconds = probe_in_turn(
            self, datasets, checkpoints, num_batches, snapshot
        )
        self.learner.restore(snapshot)
        return ProbeRuns(evaluations, seconds, [[0] for _ in datasets], expected)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.learner, name)

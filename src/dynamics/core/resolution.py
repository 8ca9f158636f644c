"""What an update reads below an evaluation's resolution (:mod:`dynamics.core.robust` solves
the problem these return).

- :func:`at_resolution`: the problem with differences below what an evaluation resolves
  read as none, so that no decision turns on a rounding difference.
- :func:`with_answer_tolerance`: accuracy constraints that let a mixture be predicted to lose
  less than one answer (``answer_tolerance``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from dynamics.core.metrics import TIE_TOLERANCE
from dynamics.core.problem import MixtureProblem


def at_resolution(
    problem: MixtureProblem, probe_budget: int, questions: Sequence[int]
) -> MixtureProblem:
    """``problem`` with differences below what an evaluation resolves (``TIE_TOLERANCE``)
    read as none: a probe's measured change ``c_t S_ij`` and a constraint's distance from its
    reference are taken as exact where they are within it of an exact value.

    ``questions`` holds, per domain, how many questions its probe-sized evaluation counts
    (``R`` batches of the domain's batch size) for an accuracy, 0 for a loss. An accuracy's
    change is then a whole number of answers, and a change within the tolerance of one is
    read as that number; for a loss the only exact value is no change.

    Otherwise a decision can turn on rounding. An accuracy at its reference reads a hair
    above or below it, a dataset whose probe flipped no answer a hair harmful or helpful,
    two datasets that flipped one answer each a hair apart; against a constraint with no
    slack that hair shuts a dataset out of every feasible mixture, and in the fallback it
    picks one of two equal datasets. Two machines, whose evaluations differ in the sixth
    digit, would then train on different data."""
    unit = _answer_units(problem, questions)
    slopes = _exact_where_close(problem.slopes * probe_budget, unit[:, None]) / probe_budget
    current = problem.current_losses.copy()
    c = list(problem.constraints)
    if c:
        reference = problem.reference_losses[c]
        current[c] = reference + _exact_where_close(current[c] - reference, unit[c])
    return replace(problem, slopes=slopes, current_losses=current)


def with_answer_tolerance(
    problem: MixtureProblem, questions: Sequence[int], answers: float
) -> MixtureProblem:
    """``problem`` with every accuracy constraint's reference lowered by ``answers`` (in [0, 1))
    of one answer of its probe-sized evaluation (``questions`` as in :func:`at_resolution`):
    a mixture predicted to lose less than that many answers counts as keeping it.

    A measured accuracy moves by whole answers, so where the current accuracy stands is
    unchanged by a tolerance below one answer; what changes is how a prediction read from
    expected accuracies is judged. On a pretrained model every dataset may lower the
    probability of the correct choices a little while no answer flips; with the accuracy
    exactly at its reference every mixture is then predicted to break it by a fraction of an
    answer, and the update falls back to the least-violating mixture, often one dataset.
    With half an answer of tolerance, a predicted change that would round to no answer lost
    is read as none."""
    if not 0 <= answers < 1:
        raise ValueError(f"answers must be in [0, 1) (a fraction of one answer), got {answers}")
    unit = _answer_units(problem, questions)
    reference = problem.reference_losses.copy()
    c = list(problem.constraints)
    reference[c] = reference[c] + answers * unit[c]  # negative accuracy: higher is worse
    return replace(problem, reference_losses=reference)


def _answer_units(problem: MixtureProblem, questions: Sequence[int]) -> np.ndarray:
    """Per domain, one answer's share of its probe-sized evaluation (0 for a loss)."""
    unit = np.array([1.0 / q if q > 0 else 0.0 for q in questions])
    if unit.shape != problem.current_losses.shape:
        raise ValueError(
            f"questions must have one entry per domain ({unit.size} for "
            f"{problem.current_losses.size})"
        )
    return unit


def _exact_where_close(values: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """``values`` moved to the nearest multiple of ``unit`` (0 where ``unit`` is 0) where
    within ``TIE_TOLERANCE`` of it, left alone elsewhere."""
    counted = unit > 0
    nearest = np.where(counted, np.round(values / np.where(counted, unit, 1.0)) * unit, 0.0)
    return np.where(np.abs(values - nearest) <= TIE_TOLERANCE, nearest, values)

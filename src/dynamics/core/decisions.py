"""Measured noise, and the decisions it sizes at an update (the decision rules of
:mod:`dynamics.core.rules` use them).

- :func:`slope_standard_errors`: each slope's standard error from the per-batch spread of
  its probe, with a binomial floor for accuracies (:func:`binomial_error`).
- :func:`target_floor`: a least weight for each target dataset, given way where the floor
  alone stands between the mixture and the constraints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dynamics.core.learner import DomainKind
from dynamics.core.problem import FEASIBILITY_TOL
from dynamics.core.robust import RobustProblem, most_feasible


def slope_standard_errors(
    anchor: np.ndarray,
    probed: np.ndarray,
    probe_budget: int,
    kinds: Sequence[DomainKind] | None = None,
) -> np.ndarray:
    """Standard error of each slope from the per-batch spread of a probe's change.

    anchor: (M, R) per-batch metric at theta_t; probed: (N, M, R) per-batch metric after the
    probe on dataset j, on the same R batches. The change on batch b, ``probed - anchor``, is
    a paired difference; its mean over batches (divided by c_t) is the slope, and its sample
    standard deviation over sqrt(R) (divided by c_t) the slope's standard error. Shape (M, N),
    in metric units per step. With one batch the spread is unknown and the errors are 0.

    ``kinds`` (one per domain) floors the error of an accuracy at the binomial standard
    error of the anchor's accuracy over its ``R * batch_size`` questions, divided by c_t, with
    the accuracy smoothed as (k + 1) / (n + 2) so that it is never 0: four batches in which no
    answer flips say little about how many would flip over a longer stretch.
    """
    anchor = np.asarray(anchor, dtype=float)
    probed = np.asarray(probed, dtype=float)
    if probed.ndim != 3 or probed.shape[1:] != anchor.shape:
        raise ValueError(
            f"probed must have shape (N, {anchor.shape[0]}, {anchor.shape[1]}), got {probed.shape}"
        )
    if probe_budget < 1:
        raise ValueError(f"probe_budget must be >= 1, got {probe_budget}")
    num_batches = anchor.shape[1]
    if num_batches < 2:
        errors = np.zeros((anchor.shape[0], probed.shape[0]))
    else:
        change = probed - anchor[None]  # (N, M, R)
        spread = change.std(axis=2, ddof=1)  # (N, M)
        errors = (spread / math.sqrt(num_batches) / probe_budget).T
    if kinds is not None:
        if len(kinds) != anchor.shape[0]:
            raise ValueError(
                f"kinds must have one entry per domain ({anchor.shape[0]}), got {len(kinds)}"
            )
        for i, kind in enumerate(kinds):
            if kind.metric == "accuracy":
                errors[i] = np.maximum(
                    errors[i],
                    binomial_error(-anchor[i].mean(), num_batches * kind.batch_size) / probe_budget,
                )
    return errors


def binomial_error(accuracy: float, questions: int) -> float:
    """Standard error of an accuracy measured on ``questions`` questions, with the accuracy
    smoothed as (k + 1) / (n + 2) (Laplace), so that it is positive even at 0 or 1."""
    smoothed = (accuracy * questions + 1.0) / (questions + 2.0)
    return math.sqrt(smoothed * (1.0 - smoothed) / questions)


def target_floor(
    rp: RobustProblem, target_datasets: Sequence[int], floor: float
) -> tuple[RobustProblem, dict[str, Any]]:
    """``rp`` with each target dataset held at ``floor`` or more
    (:attr:`RobustProblem.least_weights`), unless the floor alone stands between the mixture
    and the constraints, with what the record says about it.

    - Some mixture with the floor is predicted to keep every constraint: it holds, and the
      solver picks the best such mixture.
    - None is, but one without the floor is: what it holds is what the constraints cannot
      afford over this horizon, so it gives way, and ``lifted_by`` names the constraints the
      floored mixtures were predicted to break.
    - None is either way (a constraint below its reference that no probe is predicted to
      repair in time, often by noise): the floor holds, so the fallback's least-violating
      mixture keeps target data (``no_mixture_feasible``) instead of giving it none."""
    targets = list(target_datasets)
    if floor * len(targets) >= 1.0:
        raise ValueError(
            f"target_floor {floor} for each of {len(targets)} target datasets leaves no weight to "
            "the "
            f"others: set method.floors.targets below {1.0 / len(targets):.3g}"
        )
    record: dict[str, Any] = {"floor": floor, "target_datasets": targets, "lifted_by": []}
    least = np.zeros(rp.problem.num_datasets)
    least[targets] = floor
    if not least.any():
        return rp, record
    floored = replace(rp, least_weights=least)
    held_mixture = most_feasible(floored)
    if floored.max_violation(held_mixture) <= FEASIBILITY_TOL:
        return floored, record
    if rp.max_violation(most_feasible(rp)) > FEASIBILITY_TOL:
        record["no_mixture_feasible"] = True
        return floored, record
    record["lifted_by"] = [
        int(c)
        for c, v in zip(rp.problem.constraints, floored.violations(held_mixture), strict=True)
        if v > FEASIBILITY_TOL
    ]
    return rp, record

"""Measured noise, and the decisions it sizes at an update (options beyond the paper,
:mod:`dynamics.core.options` lists them all).

- :func:`slope_standard_errors`: each slope's standard error from the per-batch spread of
  its probe, with a binomial floor for accuracies (:func:`binomial_error`).
- :class:`PredictionCalibration` and :func:`calibrated`: a per-step bias learned from past
  updates' misses, which only ever tightens a constraint.
- :class:`DatasetCalibration` and :func:`dataset_calibrated`: the same misses attributed to
  the datasets that were trained on, so that a harm only long stretches of training show
  counts against the datasets that caused it (and not against the others).
- :func:`confident_step`: move from the mixture in force toward the solver's answer as far
  as the answer's predicted gain is worth in standard errors.
- :func:`keep_target_share`: keep a share of the mixture on the targets' own data while the
  constraints allow.
- :func:`general_fallback`: where no mixture is predicted to keep every constraint, train
  the non-target datasets' least-violating mixture unless target data is predicted to
  violate less by more than noise.
- :func:`warmup_room`: the dense warmup's mixture, target data held at its least weight and
  the non-target data predicted to leave the constraints the most room.
- :func:`target_floor`: a least weight for each target dataset (and, with ``general``, for
  every other one while there are constraints), given way where the floors alone stand
  between the mixture and the constraints; :func:`past_floor_deadline`: whether an update
  drops them because the run has no feasible checkpoint yet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dynamics.core.learner import DomainKind
from dynamics.core.policy_interface import UpdateContext
from dynamics.core.problem import FEASIBILITY_TOL, MixtureProblem
from dynamics.core.robust import RobustProblem, held_at_floor, most_feasible, solve_direct


def slope_standard_errors(
    anchor: np.ndarray, probed: np.ndarray, probe_budget: int, kinds: Sequence[DomainKind] | None = None
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
        raise ValueError(f"probed must have shape (N, {anchor.shape[0]}, {anchor.shape[1]}), got {probed.shape}")
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
            raise ValueError(f"kinds must have one entry per domain ({anchor.shape[0]}), got {len(kinds)}")
        for i, kind in enumerate(kinds):
            if kind.metric == "accuracy":
                errors[i] = np.maximum(errors[i], binomial_error(-anchor[i].mean(), num_batches * kind.batch_size) / probe_budget)
    return errors


def binomial_error(accuracy: float, questions: int) -> float:
    """Standard error of an accuracy measured on ``questions`` questions, with the accuracy
    smoothed as (k + 1) / (n + 2) (Laplace), so that it is positive even at 0 or 1."""
    smoothed = (accuracy * questions + 1.0) / (questions + 2.0)
    return math.sqrt(smoothed * (1.0 - smoothed) / questions)


@dataclass
class PredictionCalibration:
    """Closed-loop correction: a per-step bias of past predictions, per domain.

    Update k predicted losses ``horizon_k`` steps ahead and missed by ``e_k = realized -
    predicted``. Read as ``e_k = b H_k + noise`` with noise of constant size (evaluation
    noise does not grow with the horizon), the least-squares bias is ``sum e_k H_k /
    sum H_k^2``. :meth:`bias` adds ``H^2`` of the horizon about to be predicted to the
    denominator: a prior that the bias is zero, as strong as one past update of that
    horizon. So a dense warmup's one-step updates, whose errors are one quiz question of
    noise, cannot set a correction that is then multiplied by a 128-step horizon, and the
    correction grows only as past horizons reach the one being predicted.
    The correction only ever tightens: a bias below zero (losses ended lower than predicted)
    is clipped to zero, so a prediction that under-states gains, as diminishing returns do
    by design, never loosens a constraint.
    Units: metric per step (positive: losses ended higher than predicted).
    """

    num_domains: int
    weighted_error: np.ndarray = field(init=False)
    horizon_squares: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.weighted_error = np.zeros(self.num_domains)

    def observe(self, predicted: np.ndarray, realized: np.ndarray, horizon: int) -> None:
        error = np.asarray(realized, dtype=float) - np.asarray(predicted, dtype=float)
        if error.shape != (self.num_domains,) or not np.all(np.isfinite(error)):
            return  # nothing trustworthy to learn from
        self.weighted_error = self.weighted_error + error * horizon
        self.horizon_squares += float(horizon) ** 2
        self.count += 1

    def bias(self, horizon: float) -> np.ndarray:
        """The per-step bias to add to a prediction ``horizon`` steps ahead."""
        if self.count == 0:
            return np.zeros(self.num_domains)
        return np.maximum(self.weighted_error / (self.horizon_squares + float(horizon) ** 2), 0.0)

    def state_dict(self) -> dict[str, Any]:
        return {
            "weighted_error": self.weighted_error.tolist(),
            "horizon_squares": self.horizon_squares,
            "count": self.count,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PredictionCalibration:
        calibration = cls(len(state["weighted_error"]))
        calibration.weighted_error = np.asarray(state["weighted_error"], dtype=float)
        calibration.horizon_squares = float(state["horizon_squares"])
        calibration.count = int(state["count"])
        return calibration


def calibrated(problem: MixtureProblem, bias: np.ndarray) -> MixtureProblem:
    """The problem with each constraint's current loss shifted by ``H_t * bias_i`` (the
    calibrated prediction of eq. 3.3 is then ``L_i + H_t (S_i.w + b_i)``)."""
    shift = np.zeros_like(problem.current_losses)
    c = list(problem.constraints)
    shift[c] = problem.horizon * np.asarray(bias, dtype=float)[c]
    return replace(problem, current_losses=problem.current_losses + shift)


@dataclass
class DatasetCalibration:
    """Closed-loop correction per dataset: how much each dataset's slope under-stated its
    realized harm to each constraint over past horizons.

    Over update k's horizon the run trained ``x_k = H_k w_k`` steps on the datasets (w_k the
    mixture in force) and missed its prediction by ``e_k = realized - predicted`` (M,). Read
    as ``e_k = B x_k + noise``, with B (M, N) the per-step correction of each slope, every
    domain's row of B is the ridge regression ``(sum x_k x_k^T + lambda I)^-1 sum x_k e_ik``.
    ``lambda = H^2 / N`` for the horizon about to be predicted: a prior that B is zero, as
    strong in total (its trace) as one past update of that horizon on the uniform mixture,
    as :class:`PredictionCalibration`'s prior is. Updates that trained on different
    mixtures tell the datasets apart; a dataset never trained on gets no correction.
    The correction only tightens: negative entries (a dataset did better than its probe
    said) are clipped to zero, so it can only add harm to a slope, never take harm away.
    Units: metric per step of the dataset (positive: losses ended higher than predicted).

    Where the paper's probes are short (16 steps in the demo) and a constraint decays only
    over long stretches without the data that supports it (an accuracy recalled from one
    dataset), probes show no harm from the other datasets; this correction learns it from
    the first horizon that realized it, and predicts it for mixtures that repeat it.
    """

    num_domains: int
    num_datasets: int
    gram: np.ndarray = field(init=False)
    cross: np.ndarray = field(init=False)
    count: int = 0

    def __post_init__(self) -> None:
        self.gram = np.zeros((self.num_datasets, self.num_datasets))
        self.cross = np.zeros((self.num_domains, self.num_datasets))

    def observe(self, predicted: np.ndarray, realized: np.ndarray, horizon: int, weights: np.ndarray) -> None:
        error = np.asarray(realized, dtype=float) - np.asarray(predicted, dtype=float)
        steps = float(horizon) * np.asarray(weights, dtype=float)
        if error.shape != (self.num_domains,) or steps.shape != (self.num_datasets,):
            return
        if not (np.all(np.isfinite(error)) and np.all(np.isfinite(steps))):
            return  # nothing trustworthy to learn from
        self.gram = self.gram + np.outer(steps, steps)
        self.cross = self.cross + np.outer(error, steps)
        self.count += 1

    def correction(self, horizon: float) -> np.ndarray:
        """(M, N): the per-step correction to add to each slope for a prediction ``horizon``
        steps ahead; zero before the first observed horizon, never negative."""
        if self.count == 0:
            return np.zeros((self.num_domains, self.num_datasets))
        prior = float(horizon) ** 2 / self.num_datasets
        solved = np.linalg.solve(self.gram + prior * np.eye(self.num_datasets), self.cross.T).T
        return np.maximum(solved, 0.0)

    def state_dict(self) -> dict[str, Any]:
        return {"gram": self.gram.tolist(), "cross": self.cross.tolist(), "count": self.count}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> DatasetCalibration:
        cross = np.asarray(state["cross"], dtype=float)
        calibration = cls(*cross.shape)
        calibration.gram = np.asarray(state["gram"], dtype=float)
        calibration.cross = cross
        calibration.count = int(state["count"])
        return calibration


def dataset_calibrated(problem: MixtureProblem, correction: np.ndarray) -> MixtureProblem:
    """The problem with each constraint's slopes raised by its row of ``correction`` (the
    prediction of eq. 3.3 is then ``L_i + H_t (S_i + B_i).w``); other rows unchanged."""
    slopes = np.array(problem.slopes, dtype=float)
    c = list(problem.constraints)
    slopes[c] = slopes[c] + np.asarray(correction, dtype=float)[c]
    return replace(problem, slopes=slopes)


def confident_step(
    rp: RobustProblem, previous: np.ndarray, proposed: np.ndarray, full_step_z: float
) -> tuple[np.ndarray, float]:
    """Move from the mixture in force toward the solver's answer as far as the evidence
    carries: ``(1 - a) previous + a proposed``, returning the mixture and ``a``.

    The answer's predicted target gain over ``previous``, ``g.(previous - proposed)`` per
    step, is divided by its standard error ``tau ||proposed - previous||`` (tau: the summed
    target slopes' standard errors, pooled over the datasets); ``a`` is that ratio over ``full_step_z``,
    clipped to [0, 1]. A gain within noise therefore moves the mixture a little, not to
    another vertex, and a gain of ``full_step_z`` standard errors or more moves it all the
    way. Constraints come first: when ``proposed`` is robust-feasible, ``a`` is raised to
    the smallest step whose mixture is robust-feasible too (the violations are convex in w,
    so the feasible steps form an interval that ends at 1); when nothing is feasible the
    least-violating answer is taken whole. Without noise (tau = 0) a real gain is a full step.
    """
    if full_step_z <= 0:
        raise ValueError(f"full_step_z must be > 0 standard errors, got {full_step_z}")
    previous = np.asarray(previous, dtype=float)
    proposed = np.asarray(proposed, dtype=float)
    if rp.max_violation(proposed) > FEASIBILITY_TOL:
        return proposed, 1.0
    gain = rp.nominal_objective(previous) - rp.nominal_objective(proposed)
    # An evaluation's noise belongs to its batches, not to the dataset probed before it: the
    # errors of the N datasets are pooled (root mean square), N times the degrees of freedom
    # of one probe's R - 1, so that one dataset's lucky small spread cannot pass for certainty.
    pooled = float(np.sqrt(np.mean(rp.target_errors**2)))
    spread = pooled * float(np.linalg.norm(proposed - previous))
    if spread > 0:
        fraction = float(np.clip(gain / (full_step_z * spread), 0.0, 1.0))
    else:
        fraction = 1.0 if gain > 0 else 0.0

    def mixed(a: float) -> np.ndarray:
        return rp.mixture((1 - a) * previous + a * proposed)

    if rp.max_violation(mixed(fraction)) > FEASIBILITY_TOL:
        low, high = fraction, 1.0  # high is feasible
        for _ in range(60):
            mid = 0.5 * (low + high)
            if rp.max_violation(mixed(mid)) <= FEASIBILITY_TOL:
                high = mid
            else:
                low = mid
        fraction = high
    return mixed(fraction), fraction


@dataclass(frozen=True)
class TargetShare:
    """What :func:`keep_target_share` did, for the update record."""

    share: float  # target datasets' total weight after it
    wanted: float
    limited_by_constraints: bool  # True: the constraints allowed less than ``wanted``
    broken: tuple[int, ...] = ()  # constraint domains predicted broken by the mixture before it

    def to_dict(self) -> dict[str, Any]:
        return {
            "share": self.share,
            "wanted": self.wanted,
            "limited_by_constraints": self.limited_by_constraints,
            **({"broken_constraints": list(self.broken)} if self.broken else {}),
        }


def keep_target_share(
    rp: RobustProblem,
    weights: np.ndarray,
    target_datasets: Sequence[int],
    wanted: float,
    in_fallback: bool = False,
) -> tuple[np.ndarray, TargetShare]:
    """Give the target datasets at least ``wanted`` of the mixture while the constraints allow.

    Below ``wanted``, the target datasets' mass is raised (the extra split equally among
    them, the other datasets scaled down together) along the segment toward a mixture with
    exactly ``wanted`` on them, as far as every robust constraint stays satisfied. A mixture
    that already breaks a predicted constraint (the fallback: no mixture was predicted to
    keep them all) is left as it is: then the constraints need the whole budget to recover,
    and the record says which constraints were broken. With ``in_fallback`` the share is
    raised there too, as far as no constraint's predicted violation grows by more than one
    standard error of its predicted change at the raised mixture (``H ||sigma_i * w||``): a
    difference the probes cannot tell from noise does not take the targets' data away.

    With a floor ``min_weight`` the other datasets give up only their weight above it, so
    the targets get at most ``1 - (number of others) min_weight``."""
    weights = np.asarray(weights, dtype=float)
    targets = list(target_datasets)
    mass = float(weights[targets].sum()) if targets else 0.0
    others = [j for j in range(len(weights)) if j not in targets]
    m = rp.problem.min_weight
    others_floor = m * len(others)
    goal = min(wanted, 1.0 - others_floor)
    if not targets or mass >= goal:
        return weights, TargetShare(mass, wanted, False)
    lifted = weights.copy()
    lifted[targets] += (goal - mass) / len(targets)
    other_mass = 1.0 - mass
    if others and other_mass > others_floor:
        lifted[others] = m + (lifted[others] - m) * ((1.0 - goal - others_floor) / (other_mass - others_floor))
    lifted = rp.mixture(lifted)
    before = rp.violations(weights)
    broken = tuple(int(c) for c, v in zip(rp.problem.constraints, before, strict=True) if v > FEASIBILITY_TOL)
    if broken and not in_fallback:
        return weights, TargetShare(mass, wanted, True, broken)
    if broken:
        allowed = np.maximum(before, 0.0)

        def acceptable(w: np.ndarray) -> bool:
            return bool(np.all(rp.violations(w) <= allowed + rp.prediction_errors(w) + FEASIBILITY_TOL))

    else:

        def acceptable(w: np.ndarray) -> bool:
            return rp.max_violation(w) <= FEASIBILITY_TOL

    if acceptable(lifted):
        return lifted, TargetShare(float(lifted[targets].sum()), wanted, False, broken)
    low, high = 0.0, 1.0  # low is acceptable
    for _ in range(60):
        mid = 0.5 * (low + high)
        if acceptable(rp.mixture((1 - mid) * weights + mid * lifted)):
            low = mid
        else:
            high = mid
    kept = rp.mixture((1 - low) * weights + low * lifted)
    return kept, TargetShare(float(kept[targets].sum()), wanted, True, broken)


def past_floor_deadline(context: UpdateContext, deadline: float, total_steps: int) -> bool:
    """Whether an update drops the floors (``floor_deadline``): it is at or past ``deadline``
    of the run's ``total_steps`` and no main evaluation has been feasible yet."""
    return context.step >= deadline * total_steps and not context.feasible_checkpoint


def target_floor(
    rp: RobustProblem, target_datasets: Sequence[int], floor: float, general: float = 0.0, dropped: bool = False
) -> tuple[RobustProblem, dict[str, Any]]:
    """``rp`` with each target dataset held at ``floor`` or more and, while ``rp`` has a
    constraint, every other dataset at ``general`` or more (:attr:`RobustProblem.least_weights`),
    unless the floors alone stand between the mixture and the constraints, with what the
    record says about them.

    - Some mixture with the floors is predicted to keep every constraint: they hold, and
      the solver picks the best such mixture.
    - None is, but one without the floors is: what they hold is what the constraints cannot
      afford over this horizon, so they give way together, and ``lifted_by`` names the
      constraints the floored mixtures were predicted to break.
    - None is either way (a constraint below its reference that no probe is predicted to
      repair in time, often by noise): the floors hold, so the fallback's least-violating
      mixture keeps target data (``no_mixture_feasible``) instead of giving it none, and keeps
      every other dataset in the mixture instead of betting it on one.

    With ``dropped`` (:func:`past_floor_deadline`) neither floor holds, and the record says so."""
    targets = list(target_datasets)
    num_others = rp.problem.num_datasets - len(targets)
    # Non-target data is trained for the constraints' sake: without one it needs no floor.
    general = general if len(rp.problem.constraints) else 0.0
    held = floor * len(targets) + general * num_others
    if held >= 1.0:
        if general == 0:
            raise ValueError(
                f"target_floor {floor} for each of {len(targets)} target datasets leaves no weight to the "
                f"others: set method.target_floor below {1.0 / len(targets):.3g}"
            )
        raise ValueError(
            f"target_floor {floor} for each of {len(targets)} target datasets and general_floor {general} for "
            f"each of the {num_others} others hold {held:.3g} of the mixture, all of it: lower them so that "
            "the floors hold less than the whole mixture"
        )
    record: dict[str, Any] = {"floor": floor, "target_datasets": targets, "lifted_by": []}
    if general > 0:
        record["general_floor"] = general
    if dropped:
        record["dropped"] = True
        return rp, record
    least = np.full(rp.problem.num_datasets, general)
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


def general_fallback(
    rp: RobustProblem, weights: np.ndarray, target_datasets: Sequence[int], z: float
) -> tuple[np.ndarray, dict[str, Any] | None]:
    """Where no mixture is predicted to keep every constraint, the non-target datasets'
    least-violating mixture, unless the least-violating mixture of all datasets
    (``weights``, the fallback's answer) still violates less after its predicted advantage
    is cut by ``z`` standard errors.

    The fallback's answer is the mixture predicted to violate least; the probes that predict
    it can be short and noisy (one step at a dense warmup's first updates), and where they
    cannot tell the datasets apart the answer is a bet on one of them, target data as often
    as not. Target data is the data whose training the constraints guard against; the
    non-target data is in the mixture for their sake. So the bet on target data is taken
    only on evidence: ``weights`` is kept when, for every constraint, its predicted violation
    plus ``z`` standard errors of its predicted difference from the non-target answer
    (``H ||sigma_i * (w - w_general)||``) is below the non-target answer's largest violation.
    A mixture predicted to keep every constraint, an answer without target data (any
    positive weight counts, a solver's rounding residue too), or a problem without
    non-target data is returned as it is. Returns the mixture and what the
    record says (``None`` where the fallback did not apply)."""
    weights = np.asarray(weights, dtype=float)
    targets = [int(j) for j in target_datasets]
    general = [j for j in range(rp.problem.num_datasets) if j not in targets]
    if not targets or not general or rp.max_violation(weights) <= FEASIBILITY_TOL or weights[targets].sum() <= 0:
        return weights, None
    if np.any(rp.floor_weights[targets] > 0):
        raise ValueError(
            "general_fallback trains no target data where no mixture is predicted feasible, and a least weight "
            "holds target data in every mixture: set method.general_fallback: 0, or method.min_weight and "
            "method.target_floor to 0"
        )
    restricted, _ = held_at_floor(rp, targets)  # target data at 0, checked above
    alternative = np.zeros_like(weights)
    alternative[general] = solve_direct(restricted).weights
    pessimistic = rp.violations(weights) + z * rp.prediction_errors(weights - alternative)
    kept = bool(pessimistic.max() < rp.max_violation(alternative))
    record = {
        "kept_targets": kept,
        "violation": rp.max_violation(weights),
        "general_violation": rp.max_violation(alternative),
        "pessimistic_violation": float(max(pessimistic.max(), 0.0)),
    }
    return (weights if kept else alternative), record


def warmup_room(
    rp: RobustProblem, answer: np.ndarray, target_datasets: Sequence[int]
) -> tuple[np.ndarray, list[float] | None]:
    """Every target dataset at its least weight (its floor; 0 without one) and the rest of
    the mixture the non-target datasets' mixture predicted to leave the constraints the
    most room (:func:`most_feasible`), with the solver's ``answer`` it replaces, for the
    record; ``answer`` itself and None for a problem without a constraint, without target
    data or without non-target data.

    At a dense warmup's first updates the probes are one to a few steps long, too short to
    tell which dataset harms a constraint, and the solver's answer is then a bet, on target
    data as often as not; target data trained on a bet stays trained, and it is the data
    the constraints guard against. The held target weights' predicted change is counted in
    (linearly), so the room is that of the whole mixture (:func:`dynamics.core.robust.held_at_floor`)."""
    problem = rp.problem
    targets = [int(j) for j in target_datasets]
    general = [j for j in range(problem.num_datasets) if j not in targets]
    if not problem.constraints or not targets or not general:
        return answer, None
    restricted, held = held_at_floor(rp, targets)
    weights = np.zeros(problem.num_datasets)
    weights[targets] = held
    weights[general] = (1.0 - float(held.sum())) * most_feasible(restricted)
    return weights, [float(x) for x in answer]

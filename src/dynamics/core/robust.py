"""How an update with decision rules (:mod:`dynamics.core.rules`) predicts and solves.

- :func:`predicted_changes`: eq. 3.3's prediction with diminishing returns beyond the probe
  (``gain_exponent``).
- :class:`RobustProblem`: the mixture problem with the slopes' standard errors and its
  pessimistic objective (``target_noise``).
- :func:`solve_direct`: the directly solved constrained optimum (``lp_candidate``); an LP
  without noise terms or diminishing returns, a convex program solved by SLSQP with them.
- :func:`select_robust`: which of the grid's candidates and the added ones an update keeps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linprog, minimize

from dynamics.core.problem import FEASIBILITY_TOL, MixtureProblem, to_floored_simplex


def tempered_progress(u: np.ndarray, exponent: float) -> np.ndarray:
    """phi(u): ``u`` up to one probe length, ``1 + (u^p - 1) / p`` beyond it.

    Concave, increasing, and continuous with its first derivative at u = 1, so it only
    tempers what the straight line would extrapolate past the probe. p = 1 is the line."""
    u = np.asarray(u, dtype=float)
    if exponent >= 1.0:
        return u
    beyond = 1.0 + (np.maximum(u, 1.0) ** exponent - 1.0) / exponent
    return np.where(u <= 1.0, u, beyond)


def predicted_changes(
    problem: MixtureProblem, weights: np.ndarray, exponent: float, probe_budget: int
) -> np.ndarray:
    """Predicted change of every domain over the horizon, shape (M,), with diminishing
    returns beyond the probe (``gain_exponent``): ``c_t sum_j S_ij phi(w_j H_t / c_t)`` over
    the improving entries (S_ij < 0), ``H_t sum_j S_ij w_j`` over the others. With
    ``exponent`` 1 this is eq. 3.3's ``H_t S w``. Harms stay linear, which keeps every
    prediction convex in w."""
    w = np.asarray(weights, dtype=float)
    if exponent >= 1.0:
        return problem.horizon * (problem.slopes @ w)
    slopes = problem.slopes
    u = w * problem.horizon / probe_budget
    gains = probe_budget * slopes * tempered_progress(u, exponent)[None, :]
    per_entry = np.where(slopes < 0, gains, problem.horizon * slopes * w[None, :])
    return per_entry.sum(axis=1)


@dataclass(frozen=True)
class RobustProblem:
    """A mixture problem with standard errors of its slopes (robust counterpart of eq. 3.1).

    problem:          the nominal problem.
    slope_errors:     sigma, shape (M, N), standard errors of the slopes (metric per step).
    target_z:         pessimism in standard errors of the summed target slope.
    gain_exponent:    p of :func:`predicted_changes` (1: the linear prediction of eq. 3.3).
    probe_budget:     c_t, the probe's length in steps (sets where diminishing returns start).
    least_weights:    each dataset's least weight (N,), at or above the problem's min_weight
                      (``target_floor`` raises the target datasets'), or None: min_weight.
    """

    problem: MixtureProblem
    slope_errors: np.ndarray
    target_z: float = 0.0
    gain_exponent: float = 1.0
    probe_budget: int = 1
    least_weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.least_weights is not None:
            least = np.maximum(np.asarray(self.least_weights, dtype=float), self.problem.min_weight)
            if least.shape != (self.problem.num_datasets,) or float(least.sum()) > 1.0 + 1e-12:
                raise ValueError(
                    f"least_weights must have one entry per dataset ({self.problem.num_datasets}) "
                    f"and sum to at most 1, got {self.least_weights}"
                )
            object.__setattr__(self, "least_weights", least)
        errors = np.asarray(self.slope_errors, dtype=float)
        if (
            errors.shape != self.problem.slopes.shape
            or not np.all(np.isfinite(errors))
            or np.any(errors < 0)
        ):
            raise ValueError(
                f"slope_errors must be finite, >= 0 and of shape {self.problem.slopes.shape}"
            )
        object.__setattr__(self, "slope_errors", errors)
        if self.probe_budget < 1:
            raise ValueError(f"probe_budget must be >= 1, got {self.probe_budget}")

    @property
    def floor_weights(self) -> np.ndarray:
        """Each dataset's least weight: ``least_weights``, or the problem's ``min_weight``."""
        if self.least_weights is None:
            return np.full(self.problem.num_datasets, self.problem.min_weight)
        return self.least_weights

    @property
    def bounds(self) -> list[tuple[float, float]]:
        """Each weight's bounds for a solver: [its least weight, 1]."""
        return [(float(least), 1.0) for least in self.floor_weights]

    def mixture(self, w: np.ndarray) -> np.ndarray:
        """A solver's answer made an exact mixture: on the simplex, every weight at or above
        its least weight."""
        return to_floored_simplex(
            w, self.problem.min_weight if self.least_weights is None else self.least_weights
        )

    @property
    def nonlinear_prediction(self) -> bool:
        """Whether predictions are not linear in w: diminishing returns."""
        return self.gain_exponent < 1.0

    def predicted_losses(self, weights: np.ndarray) -> np.ndarray:
        """L_hat(w), shape (M,): eq. 3.3, or with diminishing returns
        (:func:`predicted_changes`)."""
        if not self.nonlinear_prediction:
            return self.problem.predicted_losses(weights)
        changes = predicted_changes(self.problem, weights, self.gain_exponent, self.probe_budget)
        return self.problem.current_losses + changes

    @property
    def _constraint_rows(self) -> list[int]:
        return list(self.problem.constraints)

    @property
    def target_errors(self) -> np.ndarray:
        """tau_j: standard error of sum_{i in T} S_ij (target domains are scored on their own
        batches, so their errors add in quadrature)."""
        t = list(self.problem.targets)
        return np.sqrt((self.slope_errors[t] ** 2).sum(axis=0))

    def violations(self, weights: np.ndarray) -> np.ndarray:
        """Predicted loss minus reference, per constraint (positive = violated)."""
        c = self._constraint_rows
        return self.predicted_losses(weights)[c] - self.problem.reference_losses[c]

    def max_violation(self, weights: np.ndarray) -> float:
        v = self.violations(weights)
        return float(max(0.0, v.max())) if v.size else 0.0

    def objective(self, weights: np.ndarray) -> float:
        """g.w + z ||tau * w||: the target objective, pessimistic by z standard errors.
        With diminishing returns ``g.w`` is the targets' summed predicted change over H_t."""
        w = np.asarray(weights, dtype=float)
        spread = float(np.sqrt(((self.target_errors * w) ** 2).sum()))
        return self.nominal_objective(w) + self.target_z * spread

    def nominal_objective(self, weights: np.ndarray) -> float:
        """The targets' summed predicted change per step, without pessimism."""
        if not self.nonlinear_prediction:
            return self.problem.target_objective(weights)
        t = list(self.problem.targets)
        changes = predicted_changes(self.problem, weights, self.gain_exponent, self.probe_budget)
        return float(changes[t].sum()) / self.problem.horizon


@dataclass(frozen=True)
class Candidate:
    """A mixture added to the grid's candidates; ``source`` names it in the record."""

    source: str
    weights: np.ndarray


@dataclass(frozen=True)
class DirectCandidate:
    """The direct solution of the robust program: its weights and whether it is feasible
    (every robust violation <= FEASIBILITY_TOL); when infeasible, the weights minimise the
    largest robust violation."""

    weights: np.ndarray
    feasible: bool
    max_violation: float
    # False: SLSQP reported no success (``message`` says why); the weights are checked all
    # the same.
    converged: bool = True
    message: str = ""

    def candidate(self) -> Candidate:
        """The weights as a candidate beside the grid's."""
        return Candidate("direct", self.weights)


def solve_direct(rp: RobustProblem) -> DirectCandidate:
    """min_w  g.w + z_T ||tau * w||   s.t.   L_hat_i(w) <= L^ref_i,
    w on the simplex. When no w satisfies the constraints, the fallback is lexicographic:
    the smallest largest violation, then among those the smallest total violation, then the
    best objective (:func:`_least_violating`).

    Without the noise term or diminishing returns both programs are linear and solved exactly by
    HiGHS; with them they are convex (a second-order cone, convex predictions) and solved by SLSQP
    from the linear solution (or the most feasible point), then made exactly feasible by moving
    toward the most feasible point (convexity makes the segment between a feasible point and the
    strictly feasible centre feasible from some point on). SLSQP's answer is kept where its
    objective is finite and no worse than its starting point's; whether SLSQP reports success is
    recorded (``converged``, ``message``) and decides nothing, since on the same problem the report
    can differ with rounding while the answer does not.
    """
    problem = rp.problem
    n = problem.num_datasets
    centre = most_feasible(rp)
    if rp.max_violation(centre) > FEASIBILITY_TOL:
        fallback = _least_violating(rp, centre)
        return DirectCandidate(fallback, False, rp.max_violation(fallback))
    if n == 1:
        return DirectCandidate(centre, True, 0.0)
    linear = _linear_optimum(rp) if not rp.nonlinear_prediction else None
    pessimistic = rp.nonlinear_prediction or (
        rp.target_z > 0 and bool(np.any(rp.target_errors > 0))
    )
    if linear is not None and not pessimistic:
        linear = _pull_into_feasible(rp, linear, centre)
        return DirectCandidate(linear, True, rp.max_violation(linear))
    start = linear if linear is not None else centre
    scale = max(float(np.abs(problem.slopes[list(problem.targets)].sum(axis=0)).max()), 1e-12)
    result = minimize(
        lambda w: rp.objective(w) / scale,
        start,
        method="SLSQP",
        bounds=rp.bounds,
        constraints=[
            {"type": "eq", "fun": lambda w: np.array([w.sum() - 1.0])},
            {"type": "ineq", "fun": lambda w: -rp.violations(w)},
        ],
        options={"ftol": 1e-12, "maxiter": 500},
    )
    weights = rp.mixture(result.x)
    if not np.isfinite(rp.objective(weights)) or rp.objective(weights) > rp.objective(start):
        weights = start
    weights = _pull_into_feasible(rp, weights, centre)
    return DirectCandidate(
        weights, True, rp.max_violation(weights), bool(result.success), str(result.message)
    )


def most_feasible(rp: RobustProblem) -> np.ndarray:
    """The mixture with the smallest largest robust violation (phase one), feasible if any
    mixture is: the linear program, refined by SLSQP when the predictions are not linear in w."""
    problem = rp.problem
    n = problem.num_datasets
    c = list(problem.constraints)
    if not c:
        return np.full(n, 1.0 / n)
    change = problem.horizon * problem.slopes[c]
    slack = problem.reference_losses[c] - problem.current_losses[c]
    # min t  s.t.  A w - t <= b,  1.w = 1,  w >= 0   (variables w, t)
    result = linprog(
        c=np.concatenate([np.zeros(n), [1.0]]),
        A_ub=np.hstack([change, -np.ones((len(c), 1))]),
        b_ub=slack,
        A_eq=np.concatenate([np.ones(n), [0.0]])[None, :],
        b_eq=[1.0],
        bounds=[*rp.bounds, (None, None)],
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    best = rp.mixture(result.x[:n]) if result.status == 0 else np.full(n, 1.0 / n)
    if not rp.nonlinear_prediction:
        return best
    starts = [best, np.full(n, 1.0 / n)]
    for start in starts:
        t0 = rp.max_violation(start) + 1.0
        out = minimize(
            lambda x: x[n],
            np.concatenate([start, [t0]]),
            jac=lambda x: np.concatenate([np.zeros(n), [1.0]]),
            method="SLSQP",
            bounds=[*rp.bounds, (None, None)],
            constraints=[
                {"type": "eq", "fun": lambda x: np.array([x[:n].sum() - 1.0])},
                {"type": "ineq", "fun": lambda x: x[n] - rp.violations(x[:n])},
            ],
            options={"ftol": 1e-14, "maxiter": 500},
        )
        candidate = rp.mixture(out.x[:n])
        if _worst(rp, candidate) < _worst(rp, best):
            best = candidate
    return best


def _least_violating(rp: RobustProblem, centre: np.ndarray) -> np.ndarray:
    """Among mixtures whose largest violation is that of ``centre`` (the smallest there is),
    the one with the smallest total violation, and among those the best objective.

    The paper's fallback stops at the first criterion. When one constraint is broken at
    theta_t and no dataset moves it within the probe (an accuracy that no short probe
    changes), every mixture ties on it, and the tie went to the best target objective,
    which then ignored every other constraint.

    The solver is held to half the tolerance (``FEASIBILITY_TOL``) that its answer is then
    checked against. Checked against the solver's own bound, an answer on it (where the best
    mixture lies) passed or failed by rounding, and evaluations a millionth apart took the
    run to two different mixtures; held to the bound itself, with no room, SLSQP often stops
    where it starts."""
    n = rp.problem.num_datasets
    num_c = len(rp.problem.constraints)
    cap = _worst(rp, centre) + FEASIBILITY_TOL
    solver_cap = cap - FEASIBILITY_TOL / 2
    # Variables x = (w, s): s_i >= max(0, v_i(w)) is constraint i's violation.
    simplex = {"type": "eq", "fun": lambda x: np.array([x[:n].sum() - 1.0])}
    capped = {"type": "ineq", "fun": lambda x: solver_cap - rp.violations(x[:n])}
    above = {"type": "ineq", "fun": lambda x: x[n:] - rp.violations(x[:n])}
    bounds = rp.bounds + [(0.0, None)] * num_c
    x0 = np.concatenate([centre, np.maximum(rp.violations(centre), 0.0)])
    options = {"ftol": 1e-14, "maxiter": 500}
    total = minimize(
        lambda x: x[n:].sum(),
        x0,
        method="SLSQP",
        bounds=bounds,
        constraints=[simplex, capped, above],
        options=options,
    )
    first = rp.mixture(total.x[:n]) if total.success else centre
    best_total = _total_violation(rp, first)
    if _worst(rp, first) > cap or best_total > _total_violation(rp, centre):
        first, best_total = centre, _total_violation(rp, centre)
    limit = best_total + FEASIBILITY_TOL
    scale = max(float(np.abs(rp.problem.slopes[list(rp.problem.targets)].sum(axis=0)).max()), 1e-12)
    budget = {"type": "ineq", "fun": lambda x: limit - FEASIBILITY_TOL / 2 - x[n:].sum()}
    x1 = np.concatenate([first, np.maximum(rp.violations(first), 0.0)])
    best = minimize(
        lambda x: rp.objective(x[:n]) / scale,
        x1,
        method="SLSQP",
        bounds=bounds,
        constraints=[simplex, capped, above, budget],
        options=options,
    )
    candidate = rp.mixture(best.x[:n])
    if (
        _worst(rp, candidate) <= cap
        and _total_violation(rp, candidate) <= limit
        and rp.objective(candidate) < rp.objective(first)
    ):
        return candidate
    return first


def _total_violation(rp: RobustProblem, w: np.ndarray) -> float:
    return float(np.maximum(rp.violations(w), 0.0).sum())


def _worst(rp: RobustProblem, w: np.ndarray) -> float:
    v = rp.violations(w)
    return float(v.max()) if v.size else -math.inf


def _linear_optimum(rp: RobustProblem) -> np.ndarray | None:
    """The exact optimum of the linear program (linear predictions), or None if infeasible."""
    problem = rp.problem
    n = problem.num_datasets
    c = list(problem.constraints)
    g = problem.slopes[list(problem.targets)].sum(axis=0)
    scale = max(float(np.abs(g).max()), 1e-12)
    result = linprog(
        c=g / scale,
        A_ub=problem.horizon * problem.slopes[c] if c else None,
        b_ub=(problem.reference_losses[c] - problem.current_losses[c]) if c else None,
        A_eq=np.ones((1, n)),
        b_eq=[1.0],
        bounds=rp.bounds,
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    return rp.mixture(result.x) if result.status == 0 else None


def _pull_into_feasible(rp: RobustProblem, weights: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """The point closest to ``weights`` on the segment to the feasible ``centre`` that
    satisfies every robust constraint (bisection; the feasible part is an interval that
    contains the centre)."""
    if rp.max_violation(weights) <= FEASIBILITY_TOL:
        return weights
    low, high = 0.0, 1.0  # fraction of the way to the centre: high is feasible
    for _ in range(60):
        mid = 0.5 * (low + high)
        if rp.max_violation((1 - mid) * weights + mid * centre) <= FEASIBILITY_TOL:
            high = mid
        else:
            low = mid
    return rp.mixture((1 - high) * weights + high * centre)


@dataclass(frozen=True)
class RobustChoice:
    """What the robust selection picked, for the update record."""

    weights: np.ndarray
    index: int  # position among the candidates: the grid's in order, then the added ones
    source: str  # "grid", or the added candidate's source ("direct")
    feasible: bool  # robust feasibility
    max_violation: float  # robust, >= 0
    objective: float  # pessimistic target objective

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights": [float(x) for x in self.weights],
            "source": self.source,
            "feasible": bool(self.feasible),
            "max_violation": float(self.max_violation),
            "objective": float(self.objective),
        }


def select_robust(
    rp: RobustProblem, grid_weights: Sequence[np.ndarray], added: Sequence[Candidate] = ()
) -> RobustChoice:
    """Appendix G's rule with the robust measures: among candidates whose robust violations
    are all <= FEASIBILITY_TOL, the lowest pessimistic objective; if none, the smallest
    largest robust violation, then the smallest total violation, then the objective. The
    grid's candidates come first, then ``added`` in order, so ties keep the paper's choice.
    With least weights above the problem's min_weight the grid's candidates are raised to
    them first."""
    scored = [("grid", np.asarray(w, dtype=float)) for w in grid_weights]
    if rp.least_weights is not None:
        scored = [(source, rp.mixture(w)) for source, w in scored]
    scored.extend((c.source, np.asarray(c.weights, dtype=float)) for c in added)
    rows = [
        (index, source, w, rp.max_violation(w), rp.objective(w))
        for index, (source, w) in enumerate(scored)
    ]
    feasible = [r for r in rows if r[3] <= FEASIBILITY_TOL]
    if feasible:
        index, source, w, violation, objective = _best_objective(feasible)
    else:
        # Largest violation first, then the total, each equal up to FEASIBILITY_TOL, then the
        # objective: see _least_violating for why the paper's rule needs the second key.
        smallest = min(r[3] for r in rows)
        rows = [r for r in rows if r[3] <= smallest + FEASIBILITY_TOL]
        least_total = min(_total_violation(rp, r[2]) for r in rows)
        rows = [r for r in rows if _total_violation(rp, r[2]) <= least_total + FEASIBILITY_TOL]
        index, source, w, violation, objective = _best_objective(rows)
    return RobustChoice(w, index, source, violation <= FEASIBILITY_TOL, violation, objective)


OBJECTIVE_TIE = 1e-9
"""Objectives within this relative distance of the best are tied: several of the grid's
(lambda, eps) points reach the same mixture, and their objectives then differ by rounding
alone, which two versions of numpy or scipy round differently."""


_Row = tuple[int, str, np.ndarray, float, float]  # index, source, weights, violation, objective


def _best_objective(rows: list[_Row]) -> _Row:
    """The first of the rows tied with the lowest objective (:data:`OBJECTIVE_TIE`)."""
    least = min(r[4] for r in rows)
    tied = [r for r in rows if r[4] <= least + OBJECTIVE_TIE * abs(least)]
    return min(tied, key=lambda r: r[0])

"""The simplex solver of DynaMiCS (paper section 3.3, eq. 3.4, and appendix G).

At each update the controller hands over a :class:`MixtureProblem` and gets back weights:

* :func:`solve_penalized` minimises the squared-hinge relaxation (eq. 3.4) for one
  (lambda, eps) pair;
* :func:`solve` runs it over the (lambda, eps) grid of appendix G and selects a candidate
  the way the paper does: the feasible one with the lowest target objective, else the one
  with the smallest maximum violation;
* :func:`solve_lp` solves the hard-constrained linear program (eq. 3.1 with eq. 3.3
  substituted) with HiGHS, to report whether the linearised problem is feasible at all.

How eq. 3.4 is solved. Written with ``g = sum_{i in T} S_i`` (loss per step),
``A = H_t S_C`` (loss) and ``b = L^ref_C - L_C(theta_t) - eps`` (loss), it reads

    F(w) = g.w + lambda * ||max(0, A w - b)||^2        over the simplex,

a convex piecewise-quadratic problem. It is given to SLSQP in its smooth epigraph form
(a quadratic objective under linear constraints), then *polished*: the support of ``w``
and the set of penalised constraints are read off the SLSQP point and the KKT equations
of that piece are solved exactly. Every answer carries a duality gap (Lagrangian dual
of the epigraph form, :func:`duality_gap`), a certified upper bound on ``F(w) - min F``;
a solve is accepted once the gap is below ``GAP_RTOL`` of the objective's scale, and
retried with a tighter SLSQP tolerance otherwise.

Across the grid, neighbouring (lambda, eps) points mostly share their piece, so each
solve first polishes its neighbour's solution; SLSQP runs only where the piece changes
(about 8 of the 45 points for N = M = 20), which keeps a full grid near 20 ms.

A floor ``problem.min_weight`` > 0 is respected exactly by solving the problem in ``v``,
``w = m 1 + (1 - N m) v`` (:meth:`MixtureProblem.above_floor`), on the simplex, and mapping
the answer back: every weight the solvers return is then at least ``m``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linprog, minimize
from threadpoolctl import ThreadpoolController

from dynamics.core.problem import FEASIBILITY_TOL, MixtureProblem, lowest_up_to_rounding, to_simplex

# A penalised solve is accepted when its certified duality gap is at most this fraction
# of max(|F(w)|, max_j |g_j|); the tests hold every solve to 1e-6 of the same scale.
GAP_RTOL = 1e-9

# SLSQP stopping tolerances on the rescaled epigraph problem (objective of order 1):
# the first is enough for polishing to find the right piece almost always, the second
# is the retry when it did not.
_SLSQP_FTOL = 1e-10
_SLSQP_FTOL_RETRY = 1e-14
_SLSQP_MAXITER = 500

# Thresholds that decide, at an SLSQP point, which weights are in the support and which
# constraints are penalised; polishing tries each and keeps the smallest gap.
_PIECE_THRESHOLDS = (1e-9, 1e-6)


@dataclass(frozen=True)
class _PenalizedForm:
    """Eq. 3.4 in matrix form, for one (lambda, eps) pair.

    target_slope:      g = sum_{i in T} S_i, shape (N,), loss change per training step.
    constraint_change: A = H_t S_C, shape (|C|, N), predicted loss change over the horizon
                       when all weight is on one dataset.
    shifted_slack:     b = L^ref_C - L_C(theta_t) - eps, shape (|C|,), loss; so that
                       ``A w - b`` is the eps-shifted violation L_hat_i(w) - L^ref_i + eps.
    lam:               the penalty strength lambda.
    """

    target_slope: np.ndarray
    constraint_change: np.ndarray
    shifted_slack: np.ndarray
    lam: float

    @classmethod
    def of(cls, problem: MixtureProblem, lam: float, eps: float) -> _PenalizedForm:
        if not math.isfinite(lam) or lam <= 0:
            raise ValueError(f"lambda must be a positive number, got {lam}")
        if not math.isfinite(eps) or eps < 0:
            raise ValueError(f"eps must be a number >= 0, got {eps}")
        c = list(problem.constraints)
        return cls(
            target_slope=problem.slopes[list(problem.targets)].sum(axis=0),
            constraint_change=problem.horizon * problem.slopes[c],
            shifted_slack=problem.reference_losses[c] - problem.current_losses[c] - eps,
            lam=float(lam),
        )

    @property
    def num_datasets(self) -> int:
        return int(self.target_slope.shape[0])

    @property
    def scale(self) -> float:
        """Natural size of the objective: the largest summed target slope, in loss per step.

        Floored at 1e-12 so that target slopes that are all (nearly) zero do not blow up
        the rescaling in :func:`_slsqp_epigraph`.
        """
        return max(float(np.abs(self.target_slope).max()), 1e-12)

    def shifted_violations(self, w: np.ndarray) -> np.ndarray:
        return self.constraint_change @ w - self.shifted_slack

    def objective(self, w: np.ndarray) -> float:
        """F(w) of eq. 3.4."""
        r = np.maximum(self.shifted_violations(w), 0.0)
        return float(self.target_slope @ w + self.lam * (r @ r))

    def duality_gap(self, w: np.ndarray) -> float:
        """F(w) minus a dual lower bound on min F: a certified bound on the suboptimality of w.

        Epigraph form: min g.w + lam |s|^2 s.t. A w - b <= s, w in the simplex. For any
        multipliers mu >= 0 the Lagrangian dual is
            D(mu) = min_j (g + A^T mu)_j - b.mu - |mu|^2 / (4 lam)  <=  min F,
        and mu = 2 lam max(0, A w - b), the multipliers that are exact at the optimum, makes
        the gap zero there.
        """
        r = np.maximum(self.shifted_violations(w), 0.0)
        mu = 2.0 * self.lam * r
        dual = float(
            (self.target_slope + self.constraint_change.T @ mu).min()
            - self.shifted_slack @ mu
            - (mu @ mu) / (4.0 * self.lam)
        )
        return max(0.0, self.objective(w) - dual)

    def accepts(self, w: np.ndarray, gap: float) -> bool:
        return gap <= GAP_RTOL * max(abs(self.objective(w)), self.scale)


def _vertex(n: int, j: int) -> np.ndarray:
    w = np.zeros(n)
    w[j] = 1.0
    return w


def _slsqp_epigraph(form: _PenalizedForm, w0: np.ndarray, ftol: float) -> np.ndarray:
    """SLSQP on the epigraph form of eq. 3.4; returns a point on the simplex.

    The squared hinge has a jump in its second derivative where a constraint turns
    active, and at large lambda SLSQP's quasi-Newton model of it stalls there ("positive
    directional derivative in linesearch") with gaps up to 1e-3 relative. The epigraph
    form (variables w and s >= A w - b, s >= 0) is a smooth quadratic under linear
    constraints. The objective is divided by ``scale`` (the larger of the target slopes
    and |F(w0)|, so that it is of order one whichever term dominates) and the slack is
    written s = k u with k = sqrt(scale / (2 lam)), so the objective is g.w / scale +
    |u|^2 / 2, with the identity Hessian in u that SLSQP's BFGS starts from.
    """
    n, m = form.num_datasets, form.shifted_slack.shape[0]
    scale = max(form.scale, abs(form.objective(w0)))
    g = form.target_slope / scale
    k = math.sqrt(scale / (2.0 * form.lam))
    a, b = form.constraint_change, form.shifted_slack
    constraint_jac = np.hstack([-a, k * np.eye(m)])
    sum_jac = np.concatenate([np.ones(n), np.zeros(m)])[None, :]

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        u = x[n:]
        return float(g @ x[:n] + 0.5 * (u @ u)), np.concatenate([g, u])

    u0 = np.maximum(a @ w0 - b, 0.0) / k
    result = minimize(
        objective,
        np.concatenate([w0, u0]),
        jac=True,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * n + [(0.0, None)] * m,
        constraints=[
            {
                "type": "eq",
                "fun": lambda x: np.array([x[:n].sum() - 1.0]),
                "jac": lambda x: sum_jac,
            },
            # s >= A w - b, i.e. b - A w + k u >= 0
            {
                "type": "ineq",
                "fun": lambda x: b - a @ x[:n] + k * x[n:],
                "jac": lambda x: constraint_jac,
            },
        ],
        options={"ftol": ftol, "maxiter": _SLSQP_MAXITER},
    )
    return to_simplex(result.x[:n])


def _polish(form: _PenalizedForm, w: np.ndarray, threshold: float) -> np.ndarray | None:
    """Solve the KKT equations of eq. 3.4 exactly on the piece that ``w`` lies on.

    On the face of the simplex with support J, with the constraints P penalised, the
    stationarity conditions are linear in (w_J, tau):
        g_J + 2 lam A_PJ^T (A_PJ w_J - b_P) + tau 1 = 0,    1.w_J = 1.
    Returns None when the solution leaves the simplex (the piece was misread); whether it
    is optimal is for the duality gap to say.
    """
    support = np.flatnonzero(w > threshold)
    r = form.shifted_violations(w)
    penalized = np.flatnonzero(r > -threshold * (1.0 + np.abs(form.shifted_slack)))
    a = form.constraint_change[np.ix_(penalized, support)]
    b = form.shifted_slack[penalized]
    size = support.size
    # Divided by scale, as in _slsqp_epigraph, so lstsq's rank cut-off sees order-one rows.
    two_lam = 2.0 * form.lam / form.scale
    kkt = np.zeros((size + 1, size + 1))
    kkt[:size, :size] = two_lam * (a.T @ a)
    kkt[:size, size] = 1.0
    kkt[size, :size] = 1.0
    rhs = np.concatenate([two_lam * (a.T @ b) - form.target_slope[support] / form.scale, [1.0]])
    solution = np.linalg.lstsq(kkt, rhs, rcond=None)[0]
    w_support = solution[:size]
    if not np.all(np.isfinite(w_support)) or w_support.min() < -1e-9:
        return None
    polished = np.zeros(form.num_datasets)
    polished[support] = w_support
    return to_simplex(polished)


def _solve_form(form: _PenalizedForm, x0: np.ndarray | None) -> tuple[np.ndarray, float]:
    """Minimise eq. 3.4; returns the weights and their certified duality gap."""
    n = form.num_datasets
    if n == 1:
        return np.ones(1), 0.0
    # Without a penalty active, eq. 3.4 is linear and the best vertex is exact. It is
    # optimal for every lambda as soon as it violates no eps-shifted constraint.
    best_vertex = _vertex(n, int(np.argmin(form.target_slope)))
    if np.all(form.shifted_violations(best_vertex) <= 0.0):
        return best_vertex, 0.0

    w0 = np.full(n, 1.0 / n) if x0 is None else to_simplex(x0)
    best_w, best_gap = w0, form.duality_gap(w0)
    if x0 is not None:
        # Along the grid, the solution for the previous lambda usually lies on the same
        # piece (support, penalised constraints) as this one, so the exact KKT solve on
        # that piece is the answer and SLSQP is not needed at all.
        for threshold in _PIECE_THRESHOLDS:
            w = _polish(form, w0, threshold)
            if w is not None:
                gap = form.duality_gap(w)
                if gap < best_gap:
                    best_w, best_gap = w, gap
        if form.accepts(best_w, best_gap):
            return best_w, best_gap
    for ftol in (_SLSQP_FTOL, _SLSQP_FTOL_RETRY):
        slsqp_w = _slsqp_epigraph(form, best_w, ftol)
        attempts = [slsqp_w] + [_polish(form, slsqp_w, t) for t in _PIECE_THRESHOLDS]
        for w in attempts:
            if w is None:
                continue
            gap = form.duality_gap(w)
            if gap < best_gap:
                best_w, best_gap = w, gap
        if form.accepts(best_w, best_gap):
            break
    return best_w, best_gap


def penalized_objective(
    problem: MixtureProblem, lam: float, eps: float, weights: np.ndarray
) -> float:
    """The objective of eq. 3.4 at ``weights`` (target slope units plus lambda * loss^2)."""
    return _PenalizedForm.of(problem, lam, eps).objective(np.asarray(weights, dtype=float))


def duality_gap(problem: MixtureProblem, lam: float, eps: float, weights: np.ndarray) -> float:
    """Certified upper bound on how far ``weights`` is from the minimum of eq. 3.4 over the
    mixtures with every weight >= ``problem.min_weight`` (same units)."""
    return _PenalizedForm.of(problem.above_floor(), lam, eps).duality_gap(
        problem.unfloored(weights)
    )


def solve_penalized(
    problem: MixtureProblem, lam: float, eps: float, x0: np.ndarray | None = None
) -> np.ndarray:
    """Mixture weights minimising eq. 3.4 for one penalty strength ``lam`` and margin ``eps``.

    ``eps`` is in loss units: the penalty starts ``eps`` below each reference loss.
    ``x0`` warm-starts the solver (e.g. the solution for the previous lambda). The result
    lies exactly on the simplex: every weight >= ``problem.min_weight``, summing to 1.
    """
    if x0 is not None and np.shape(x0) != (problem.num_datasets,):
        raise ValueError(f"x0 must have length N={problem.num_datasets}, got shape {np.shape(x0)}")
    start = None if x0 is None else problem.unfloored(x0)
    with _blas_controller().limit(limits=1, user_api="blas"):
        weights, _ = _solve_form(_PenalizedForm.of(problem.above_floor(), lam, eps), start)
    return problem.floored(weights)


@dataclass(frozen=True, eq=False)
class LPResult:
    """The hard-constrained linear program: min sum_T S_i.w s.t. L_hat_i(w) <= L^ref_i (i in C).

    feasible:  whether some mixture satisfies every linearised constraint (up to
               FEASIBILITY_TOL, the same test :class:`Solution` applies).
    weights:   an optimal mixture, None when infeasible.
    objective: its target objective sum_T S_i.w (loss per step), None when infeasible.
    message:   HiGHS's status message.
    """

    feasible: bool
    weights: np.ndarray | None
    objective: float | None
    message: str


def solve_lp(problem: MixtureProblem) -> LPResult:
    """Solve the linear program of eq. 3.1 with the prediction of eq. 3.3 (HiGHS), over the
    mixtures with every weight >= ``problem.min_weight``."""
    form = _PenalizedForm.of(problem.above_floor(), lam=1.0, eps=0.0)  # lambda plays no part here
    n = problem.num_datasets
    has_constraints = form.shifted_slack.size > 0
    # Feasible means what it means for a grid candidate: every violation <= FEASIBILITY_TOL.
    # Without the slack, a mixture whose predicted loss equals its reference exactly can
    # be declared infeasible by the rounding in L^ref - L (e.g. (1 - 1e-9) - 1 != -1e-9).
    budget = form.shifted_slack + FEASIBILITY_TOL
    result = linprog(
        # HiGHS's tolerances are absolute: divide the cost (loss per step, often ~1e-3)
        # by its scale so that optimality is judged relative to it.
        c=form.target_slope / form.scale,
        A_ub=form.constraint_change if has_constraints else None,
        b_ub=budget if has_constraints else None,
        A_eq=np.ones((1, n)),
        b_eq=np.array([1.0]),
        bounds=(0.0, None),
        method="highs",
        # HiGHS's default 1e-7 feasibility tolerances are coarse next to FEASIBILITY_TOL.
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    if result.status != 0:
        return LPResult(feasible=False, weights=None, objective=None, message=str(result.message))
    weights = problem.floored(to_simplex(result.x))
    return LPResult(
        feasible=True,
        weights=weights,
        objective=problem.target_objective(weights),
        message=str(result.message),
    )


@dataclass(frozen=True, eq=False)
class Solution:
    """The mixture chosen at one update, with what the solver knows about it.

    weights:          w*, shape (N,), on the simplex.
    objective:        sum_{i in T} S_i.w* (loss change per step; lower is better).
    lambda_, eps:     the grid point that produced w* (eps in loss units).
    predicted_losses: L_hat(w*) of eq. 3.3 (with ``method.gain_exponent`` < 1, the tempered
                      prediction of :mod:`dynamics.core.robust`), shape (M,).
    feasible:         every predicted constraint loss is at or below its reference
                      (up to FEASIBILITY_TOL; eps is not counted).
    max_violation:    max_i in C of L_hat_i(w*) - L^ref_i, 0 when feasible.
    lp_feasible, lp_weights, lp_objective: the hard-constrained LP (:func:`solve_lp`).
    num_candidates:   grid points tried (len(lambdas) * len(epsilons)).
    source:           "grid", or "direct" when a robustness option's direct solution of the
                      constrained program was chosen (:mod:`dynamics.core.robust`).
    min_weight:       the floor every weight was held to (``method.floors.all``); in the
                      record only when it is above 0.
    """

    weights: np.ndarray
    objective: float
    lambda_: float
    eps: float
    predicted_losses: np.ndarray
    feasible: bool
    max_violation: float
    lp_feasible: bool
    lp_weights: np.ndarray | None
    lp_objective: float | None
    num_candidates: int
    source: str = "grid"
    min_weight: float = 0.0

    def __post_init__(self) -> None:
        # Frozen means frozen: the arrays are read-only copies.
        for name in ("weights", "predicted_losses", "lp_weights"):
            value = getattr(self, name)
            if value is not None:
                value = np.array(value, dtype=float)
                value.setflags(write=False)
                object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able python: lists, floats, bools and None."""
        floor = {"min_weight": float(self.min_weight)} if self.min_weight > 0 else {}
        return {
            "weights": [float(x) for x in self.weights],
            "objective": float(self.objective),
            "lambda": float(self.lambda_),
            "eps": float(self.eps),
            "predicted_losses": [float(x) for x in self.predicted_losses],
            "feasible": bool(self.feasible),
            "max_violation": float(self.max_violation),
            "lp_feasible": bool(self.lp_feasible),
            "lp_weights": None if self.lp_weights is None else [float(x) for x in self.lp_weights],
            "lp_objective": None if self.lp_objective is None else float(self.lp_objective),
            "num_candidates": int(self.num_candidates),
            "source": self.source,
            **floor,
        }


@dataclass(frozen=True, eq=False)
class GridCandidate:
    """Eq. 3.4's minimiser at one (lambda, eps) grid point, with its target objective and
    largest predicted violation."""

    lam: float
    eps: float
    weights: np.ndarray
    objective: float
    max_violation: float

    @property
    def feasible(self) -> bool:
        return self.max_violation <= FEASIBILITY_TOL


def _select(candidates: list[GridCandidate]) -> GridCandidate:
    """Appendix G: the feasible candidate with the lowest target objective; if none is, the one
    with the least maximum violation (then objective). Ties up to rounding go to the earliest
    grid point."""
    feasible = [c for c in candidates if c.feasible]
    if feasible:
        return lowest_up_to_rounding(feasible, lambda c: c.objective)[0]
    least = lowest_up_to_rounding(candidates, lambda c: c.max_violation)
    return lowest_up_to_rounding(least, lambda c: c.objective)[0]


def solve(problem: MixtureProblem) -> Solution:
    """Run eq. 3.4 over ``problem.grid`` and select a candidate as in appendix G."""
    with _blas_controller().limit(limits=1, user_api="blas"):
        return _solve_grid(problem)


@functools.cache
def _blas_controller() -> ThreadpoolController:
    # These problems are tiny (N, M ~ 10): BLAS threads only add overhead, and while a
    # training process keeps every core busy they fight it for CPU time (measured: the
    # median grid solve went from ~20 ms to ~1 s under load). One thread is always enough.
    return ThreadpoolController()


def grid_candidates(problem: MixtureProblem) -> list[GridCandidate]:
    """Eq. 3.4 solved at every (lambda, eps) point of ``problem.grid``, in grid order."""
    with _blas_controller().limit(limits=1, user_api="blas"):
        return _grid_candidates(problem)


def _grid_candidates(problem: MixtureProblem) -> list[GridCandidate]:
    candidates: list[GridCandidate] = []
    # Each solve is warm-started from its neighbour on the grid: the previous lambda, or
    # for the smallest lambda the same lambda at the previous eps.
    # Solved in v of MixtureProblem.above_floor (w itself without a floor), recorded in w.
    smallest_lambda_solution: np.ndarray | None = None
    free = problem.above_floor()
    for eps in problem.grid.epsilons:
        weights: np.ndarray | None = None
        for lam in sorted(problem.grid.lambdas):
            form = _PenalizedForm.of(free, lam, eps)
            if weights is None:
                weights, _ = _solve_form(form, smallest_lambda_solution)
                smallest_lambda_solution = weights
            elif np.any(form.shifted_violations(weights) > 0.0):
                weights, _ = _solve_form(form, weights)
            # else: a solution that pays no penalty stays optimal for every larger lambda,
            # F_lam'(w) >= F_lam(w) >= F_lam(w*) = F_lam'(w*) for all w.
            mixture = problem.floored(weights)
            candidates.append(
                GridCandidate(
                    lam=float(lam),
                    eps=float(eps),
                    weights=mixture,
                    objective=problem.target_objective(mixture),
                    max_violation=problem.max_violation(mixture),
                )
            )
    return candidates


def solution_of(
    problem: MixtureProblem,
    weights: np.ndarray,
    lam: float,
    eps: float,
    num_candidates: int,
    source: str = "grid",
) -> Solution:
    """The :class:`Solution` record of ``weights`` chosen for ``problem`` (with the LP beside
    it)."""
    lp = solve_lp(problem)
    max_violation = problem.max_violation(weights)
    return Solution(
        weights=weights,
        objective=problem.target_objective(weights),
        lambda_=lam,
        eps=eps,
        predicted_losses=problem.predicted_losses(weights),
        feasible=max_violation <= FEASIBILITY_TOL,
        max_violation=max_violation,
        lp_feasible=lp.feasible,
        lp_weights=lp.weights,
        lp_objective=lp.objective,
        num_candidates=num_candidates,
        source=source,
        min_weight=problem.min_weight,
    )


def _solve_grid(problem: MixtureProblem) -> Solution:
    candidates = _grid_candidates(problem)
    chosen = _select(candidates)
    return solution_of(problem, chosen.weights, chosen.lam, chosen.eps, len(candidates))

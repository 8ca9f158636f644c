"""The simplex solver (paper eq. 3.4 and appendix G) against independent references.

References: the objective written afresh from the paper (eqs. 3.3-3.4), brute force over
a fine simplex grid for N <= 3, scipy's trust-constr on the squared-hinge form (a
different method on a different formulation), HiGHS for the linear program, and a
Lagrangian dual bound that certifies how far any point is from the optimum.
"""

from __future__ import annotations

import itertools
import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.optimize import Bounds, LinearConstraint, linprog, minimize

from dynamics.core.problem import FEASIBILITY_TOL, MixtureProblem, SolverGrid
from dynamics.core.solver import (
    GridCandidate,
    LPResult,
    Solution,
    _select,
    duality_gap,
    penalized_objective,
    solve,
    solve_lp,
    solve_penalized,
)

# Every penalised solve must be within this fraction of max(|F|, max_j |g_j|) of the optimum.
REL_TOL = 1e-6

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


# ---------------------------------------------------------------- references


def summed_target_slopes(problem: MixtureProblem) -> np.ndarray:
    return problem.slopes[list(problem.targets)].sum(axis=0)


def objectives_from_paper(
    problem: MixtureProblem, lam: float, eps: float, points: np.ndarray
) -> np.ndarray:
    """Eq. 3.4 with eq. 3.3 substituted, at each column of ``points`` (N, P)."""
    c = list(problem.constraints)
    target = summed_target_slopes(problem) @ points
    predicted = problem.current_losses[c, None] + problem.horizon * (problem.slopes[c] @ points)
    hinge = np.maximum(0.0, predicted - problem.reference_losses[c, None] + eps)
    return np.asarray(target + lam * (hinge**2).sum(axis=0))


def objective_from_paper(problem: MixtureProblem, lam: float, eps: float, w: np.ndarray) -> float:
    return float(objectives_from_paper(problem, lam, eps, np.asarray(w, dtype=float)[:, None])[0])


def slope_scale(problem: MixtureProblem) -> float:
    """Largest summed target slope; below 1e-9 loss per step, slopes count as zero."""
    return max(float(np.abs(summed_target_slopes(problem)).max()), 1e-9)


def tolerance(problem: MixtureProblem, value: float) -> float:
    return REL_TOL * max(abs(value), slope_scale(problem))


def simplex_grid(n: int, steps: int) -> np.ndarray:
    """All points of the simplex with coordinates in multiples of 1/steps, shape (n, P)."""
    if n == 1:
        return np.ones((1, 1))
    if n == 2:
        t = np.arange(steps + 1) / steps
        return np.stack([t, 1.0 - t])
    i, j = np.meshgrid(np.arange(steps + 1), np.arange(steps + 1), indexing="ij")
    keep = i + j <= steps
    a, b = i[keep] / steps, j[keep] / steps
    return np.stack([a, b, 1.0 - a - b])


def trust_constr(problem: MixtureProblem, lam: float, eps: float) -> np.ndarray:
    """Eq. 3.4 by scipy's interior-point trust-constr with exact gradient and Hessian."""
    c = list(problem.constraints)
    g = summed_target_slopes(problem)
    a = problem.horizon * problem.slopes[c]
    b = problem.reference_losses[c] - problem.current_losses[c] - eps
    n = problem.num_datasets

    def hinge(w: np.ndarray) -> np.ndarray:
        return np.maximum(a @ w - b, 0.0)

    def hess(w: np.ndarray) -> np.ndarray:
        active = a[hinge(w) > 0]
        return 2.0 * lam * active.T @ active

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = minimize(
            lambda w: g @ w + lam * hinge(w) @ hinge(w),
            np.full(n, 1.0 / n),
            jac=lambda w: g + 2.0 * lam * a.T @ hinge(w),
            hess=hess,
            method="trust-constr",
            bounds=Bounds(np.zeros(n), np.ones(n)),
            constraints=[LinearConstraint(np.ones((1, n)), 1.0, 1.0)],
            options={"gtol": 1e-12, "xtol": 1e-14, "maxiter": 3000},
        )
    w = np.clip(result.x, 0.0, None)
    return w / w.sum()


def lp_value(problem: MixtureProblem, slack: float) -> float:
    """min sum_T S_i.w s.t. L_hat_i(w) <= L_ref_i + slack (i in C), by HiGHS."""
    c = list(problem.constraints)
    scale = slope_scale(problem)
    result = linprog(
        summed_target_slopes(problem) / scale,
        A_ub=problem.horizon * problem.slopes[c] if c else None,
        b_ub=(problem.reference_losses[c] - problem.current_losses[c] + slack) if c else None,
        A_eq=np.ones((1, problem.num_datasets)),
        b_eq=[1.0],
        bounds=(0.0, None),
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    assert result.status == 0, result.message
    return float(result.fun) * scale


def lp_margin(problem: MixtureProblem) -> float:
    """Largest d such that some mixture has L_hat_i(w) <= L_ref_i - d for every constraint."""
    c = list(problem.constraints)
    n = problem.num_datasets
    if not c:
        return math.inf
    a = problem.horizon * problem.slopes[c]
    b = problem.reference_losses[c] - problem.current_losses[c]
    result = linprog(
        np.r_[np.zeros(n), -1.0],
        A_ub=np.c_[a, np.ones(len(c))],
        b_ub=b,
        A_eq=np.r_[np.ones(n), 0.0][None, :],
        b_eq=[1.0],
        bounds=[(0.0, None)] * n + [(None, None)],
        method="highs",
    )
    return float(-result.fun)


def assert_on_simplex(w: np.ndarray, n: int) -> None:
    assert w.shape == (n,)
    assert np.all(np.isfinite(w))
    assert w.min() >= 0.0
    assert abs(w.sum() - 1.0) <= 1e-12


# ---------------------------------------------------------------- problems


def make_problem(
    slopes: np.ndarray,
    current: np.ndarray,
    reference: np.ndarray,
    targets: tuple[int, ...],
    constraints: tuple[int, ...],
    horizon: float,
    grid: SolverGrid | None = None,
) -> MixtureProblem:
    ref = np.full(len(current), np.nan)
    ref[list(constraints)] = reference[list(constraints)]
    return MixtureProblem(slopes, current, ref, targets, constraints, horizon, grid or SolverGrid())


@st.composite
def problems(
    draw: st.DrawFn, max_datasets: int = 5, max_domains: int = 5, margin: float | None = None
) -> MixtureProblem:
    """Random updates with slopes of the size real ones have (|S_ij| <= 1e-2 loss per step),
    including zeros, ties and repeated columns. With ``margin`` set, the references are
    built from a random mixture w0 so that L_hat_i(w0) = L_ref_i - margin: the LP is feasible."""
    n = draw(st.integers(1, max_datasets))
    m = draw(st.integers(1, max_domains))
    roles = draw(
        st.lists(st.sampled_from(["target", "constraint", "other"]), min_size=m, max_size=m)
    )
    roles[draw(st.integers(0, m - 1))] = "target"
    slope = st.one_of(
        st.sampled_from([0.0, -1e-3, 1e-3]),
        st.floats(-1e-2, 1e-2, allow_nan=False, allow_subnormal=False),
    )
    slopes = draw(arrays(float, (m, n), elements=slope))
    horizon = float(draw(st.sampled_from([1, 8, 64, 512, 1024])))
    current = draw(arrays(float, m, elements=st.floats(0.5, 4.0)))
    if margin is None:
        reference = current + draw(arrays(float, m, elements=st.floats(-0.2, 0.2)))
    else:
        w0 = draw(arrays(float, n, elements=st.floats(0.0, 1.0)))
        w0 = np.full(n, 1.0 / n) if w0.sum() <= 0 else w0 / w0.sum()
        reference = current + horizon * slopes @ w0 + margin
    targets = tuple(i for i, r in enumerate(roles) if r == "target")
    constraints = tuple(i for i, r in enumerate(roles) if r == "constraint")
    return make_problem(slopes, current, reference, targets, constraints, horizon)


def benchmark_like(seed: int, n: int = 8, m: int = 8) -> MixtureProblem:
    """Shaped like benchmarks/solver.py: half targets, half constraints, horizon 64."""
    rng = np.random.default_rng(seed)
    half = m // 2
    slopes = rng.normal(0.0, 1e-3, size=(m, n))
    slopes[:half] -= 5e-4 * rng.random((half, n))
    current = rng.uniform(1.5, 3.0, size=m)
    reference = current + rng.uniform(-0.02, 0.05, size=m)
    return make_problem(slopes, current, reference, tuple(range(half)), tuple(range(half, m)), 64.0)


grid_points = st.tuples(
    st.sampled_from(SolverGrid().lambdas), st.sampled_from(SolverGrid().epsilons)
)


# ---------------------------------------------------------------- solve_penalized


@SETTINGS
@given(problems(), grid_points)
def test_penalized_weights_are_on_the_simplex_and_certified_optimal(
    problem: MixtureProblem, point: tuple[float, float]
) -> None:
    lam, eps = point
    w = solve_penalized(problem, lam, eps)
    assert_on_simplex(w, problem.num_datasets)
    value = objective_from_paper(problem, lam, eps, w)
    assert penalized_objective(problem, lam, eps, w) == pytest.approx(value, rel=1e-12, abs=1e-15)
    assert duality_gap(problem, lam, eps, w) <= tolerance(problem, value)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("seed", range(4))
def test_penalized_matches_brute_force_on_a_fine_simplex_grid(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = 4
    slopes = rng.normal(0.0, 2e-3, size=(m, n))
    current = rng.uniform(1.0, 3.0, size=m)
    reference = current + rng.uniform(-0.05, 0.05, size=m)
    problem = make_problem(slopes, current, reference, (0, 1), (2, 3), 64.0)
    points = simplex_grid(n, steps=600)
    for lam, eps in [(1.0, 0.0), (60.0, 0.05), (5000.0, 0.0), (5000.0, 0.1)]:
        ours = objective_from_paper(problem, lam, eps, solve_penalized(problem, lam, eps))
        brute = objectives_from_paper(problem, lam, eps, points)
        best = float(brute.min())
        # No grid point beats the solver (the grid only over-estimates the minimum) ...
        assert ours <= best + tolerance(problem, best)
        # ... and the solver's point is one the grid nearly reaches (spacing 1/600).
        assert best - ours <= 1e-2 * (abs(best) + float(np.abs(slopes).max()))


@pytest.mark.parametrize("seed", range(5))
def test_penalized_agrees_with_trust_constr(seed: int) -> None:
    problem = benchmark_like(seed, n=6, m=6)
    for lam, eps in [(1.0, 0.0), (37.3, 0.05), (5000.0, 0.1)]:
        ours = objective_from_paper(problem, lam, eps, solve_penalized(problem, lam, eps))
        theirs = objective_from_paper(problem, lam, eps, trust_constr(problem, lam, eps))
        # trust-constr stops early at large lambda, so it can only be matched or beaten;
        # the duality gap bounds the other side: ours - min F <= gap.
        assert ours <= theirs + tolerance(problem, theirs)
        assert abs(ours - theirs) <= tolerance(problem, theirs) + duality_gap(
            problem, lam, eps, trust_constr(problem, lam, eps)
        )


def test_penalized_warm_start_gives_the_same_optimum() -> None:
    problem = benchmark_like(3)
    cold = solve_penalized(problem, 500.0, 0.05)
    for x0 in (
        np.full(problem.num_datasets, 1.0 / problem.num_datasets),
        cold,
        np.eye(problem.num_datasets)[2],
    ):
        warm = solve_penalized(problem, 500.0, 0.05, x0=x0)
        f_cold = objective_from_paper(problem, 500.0, 0.05, cold)
        assert abs(objective_from_paper(problem, 500.0, 0.05, warm) - f_cold) <= tolerance(
            problem, f_cold
        )


def test_penalized_rejects_bad_arguments() -> None:
    problem = benchmark_like(0)
    with pytest.raises(ValueError, match="lambda"):
        solve_penalized(problem, 0.0, 0.0)
    with pytest.raises(ValueError, match="eps"):
        solve_penalized(problem, 1.0, -0.1)
    with pytest.raises(ValueError, match="x0"):
        solve_penalized(problem, 1.0, 0.0, x0=np.ones(3))


# ---------------------------------------------------------------- solve_lp


@SETTINGS
@given(problems(max_datasets=3))
def test_lp_matches_brute_force(problem: MixtureProblem) -> None:
    lp = solve_lp(problem)
    points = simplex_grid(problem.num_datasets, steps=200)
    c = list(problem.constraints)
    predicted = problem.current_losses[c, None] + problem.horizon * problem.slopes[c] @ points
    grid_feasible = np.all(predicted <= problem.reference_losses[c, None], axis=0)
    if grid_feasible.any():
        assert lp.feasible
    if lp.feasible:
        assert lp.weights is not None and lp.objective is not None
        assert_on_simplex(lp.weights, problem.num_datasets)
        assert problem.max_violation(lp.weights) <= 1e-8
        if grid_feasible.any():
            best = float((summed_target_slopes(problem) @ points)[grid_feasible].min())
            assert lp.objective <= best + tolerance(problem, best)
    else:
        assert lp.weights is None and lp.objective is None
        assert lp_margin(problem) < 1e-9


def test_lp_reports_infeasible() -> None:
    # One dataset, and training on it raises the constrained loss: nothing is feasible.
    problem = make_problem(
        np.array([[-1e-3, -1e-3], [1e-3, 2e-3]]),
        np.array([2.0, 2.0]),
        np.array([0.0, 2.0]),
        (0,),
        (1,),
        64.0,
    )
    lp = solve_lp(problem)
    assert isinstance(lp, LPResult)
    assert not lp.feasible and lp.weights is None and lp.objective is None
    assert "infeasible" in lp.message.lower()


# ---------------------------------------------------------------- solve


@SETTINGS
@given(problems())
def test_solution_is_on_the_simplex_and_consistent(problem: MixtureProblem) -> None:
    solution = solve(problem)
    assert_on_simplex(solution.weights, problem.num_datasets)
    assert solution.num_candidates == len(problem.grid.lambdas) * len(problem.grid.epsilons)
    assert solution.lambda_ in problem.grid.lambdas and solution.eps in problem.grid.epsilons
    assert solution.objective == pytest.approx(
        problem.target_objective(solution.weights), abs=1e-15
    )
    np.testing.assert_allclose(
        solution.predicted_losses, problem.predicted_losses(solution.weights)
    )
    assert solution.max_violation == problem.max_violation(solution.weights)
    assert solution.feasible == (solution.max_violation <= FEASIBILITY_TOL)
    json.dumps(solution.to_dict(), allow_nan=False)


@SETTINGS
@given(problems())
def test_without_constraints_all_mass_goes_to_the_most_negative_summed_target_slope(
    problem: MixtureProblem,
) -> None:
    problem = make_problem(
        problem.slopes,
        problem.current_losses,
        problem.current_losses,
        problem.targets,
        (),
        problem.horizon,
    )
    solution = solve(problem)
    expected = np.zeros(problem.num_datasets)
    expected[int(np.argmin(summed_target_slopes(problem)))] = 1.0  # ties: the first dataset
    np.testing.assert_array_equal(solution.weights, expected)
    assert solution.feasible and solution.max_violation == 0.0 and solution.lp_feasible
    assert solution.objective == pytest.approx(
        float(summed_target_slopes(problem).min()), abs=1e-15
    )


def test_ties_and_all_zero_slopes_still_give_a_simplex_point() -> None:
    zeros = make_problem(np.zeros((2, 3)), np.ones(2), np.ones(2), (0,), (1,), 64.0)
    np.testing.assert_array_equal(solve(zeros).weights, [1.0, 0.0, 0.0])
    tied = make_problem(np.array([[-1.0, -1.0, 0.0]]), np.ones(1), np.ones(1), (0,), (), 1.0)
    np.testing.assert_array_equal(solve(tied).weights, [1.0, 0.0, 0.0])
    one = make_problem(np.array([[1e-3], [1e-3]]), np.ones(2), np.ones(2), (0,), (1,), 64.0)
    np.testing.assert_array_equal(solve(one).weights, [1.0])


@SETTINGS
@given(problems(margin=0.0))
def test_when_the_lp_is_feasible_the_violation_is_bounded_by_the_largest_lambda(
    problem: MixtureProblem,
) -> None:
    """What the grid guarantees when the linearised problem is feasible.

    For the eps = 0 candidate at lambda_max, F(w*) <= F(w_lp) = g.w_lp gives
    lambda_max * max_violation^2 <= g.w_lp - g.w* <= lp_objective - min_j g_j; the chosen
    candidate is feasible or violates no more than that one.
    """
    solution = solve(problem)
    assert solution.lp_feasible and solution.lp_objective is not None
    g = summed_target_slopes(problem)
    bound = math.sqrt(max(0.0, solution.lp_objective - g.min()) / max(problem.grid.lambdas))
    assert solution.max_violation <= bound + 1e-9
    if solution.feasible:
        # Feasible up to FEASIBILITY_TOL: not better than the LP relaxed by that much.
        assert solution.objective >= lp_value(problem, slack=FEASIBILITY_TOL) - tolerance(
            problem, 0.0
        )


@SETTINGS
@given(problems(margin=0.05))
def test_a_margin_of_one_grid_eps_guarantees_a_feasible_choice(problem: MixtureProblem) -> None:
    """If some mixture clears every reference by eps_k (a positive grid value), the
    (lambda_max, eps_k) candidate is feasible once lambda_max * eps_k^2 > max g - min g:
    lambda_max * |max(0, A w* - b)|^2 <= g.w0 - g.w* bounds each eps-shifted violation
    by sqrt((max g - min g) / lambda_max) < eps_k."""
    g = summed_target_slopes(problem)
    assert max(problem.grid.lambdas) * 0.05**2 > 2 * (g.max() - g.min())
    solution = solve(problem)
    assert solution.lp_feasible
    assert solution.feasible
    assert solution.objective >= lp_value(problem, slack=FEASIBILITY_TOL) - tolerance(problem, 0.0)


def test_lp_feasible_does_not_imply_a_feasible_grid_choice() -> None:
    """The feasible set of the LP is the single mixture (1/2, 1/2) and the target pulls to
    dataset 0. Every penalised candidate stops O(1/lambda) past the boundary: with eps > 0
    both constraints are penalised and w_0 = 1/2 + 1/(4 lambda), with eps = 0 only one is,
    and w_0 = 1/2 + 1/(2 lambda). The least violating is 1/(4 * 5000) = 5e-5."""
    problem = make_problem(
        slopes=np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]),
        current=np.zeros(3),
        reference=np.array([0.0, 0.5, 0.5]),
        targets=(0,),
        constraints=(1, 2),
        horizon=1.0,
    )
    solution = solve(problem)
    assert solution.lp_feasible
    np.testing.assert_allclose(solution.lp_weights, [0.5, 0.5])  # type: ignore[arg-type]
    assert not solution.feasible
    assert solution.max_violation == pytest.approx(1.0 / (4 * 5000.0), rel=1e-6)
    assert solution.eps > 0


@pytest.mark.parametrize("seed", range(4))
def test_selection_follows_appendix_g(seed: int) -> None:
    """Re-solve every grid point independently (no warm starts) and apply the rule."""
    problem = benchmark_like(seed, n=6, m=6)
    candidates = []
    for lam, eps in itertools.product(problem.grid.lambdas, problem.grid.epsilons):
        w = solve_penalized(problem, lam, eps)
        candidates.append((problem.target_objective(w), problem.max_violation(w)))
    feasible = [c for c in candidates if c[1] <= FEASIBILITY_TOL]
    expected = min(feasible) if feasible else min(candidates, key=lambda c: (c[1], c[0]))
    solution = solve(problem)
    assert solution.feasible == bool(feasible)
    assert solution.objective == pytest.approx(expected[0], abs=tolerance(problem, expected[0]))
    assert solution.max_violation == pytest.approx(expected[1], abs=1e-9)


def test_infeasible_lp_picks_the_least_violating_candidate() -> None:
    # Both datasets raise the constrained loss; dataset 1 raises it less.
    problem = make_problem(
        np.array([[-2e-3, -1e-3], [2e-3, 1e-3]]),
        np.array([2.0, 2.0]),
        np.array([0.0, 2.0]),
        (0,),
        (1,),
        64.0,
    )
    solution = solve(problem)
    assert (
        not solution.lp_feasible and solution.lp_weights is None and solution.lp_objective is None
    )
    assert not solution.feasible
    np.testing.assert_allclose(solution.weights, [0.0, 1.0], atol=1e-9)
    assert solution.max_violation == pytest.approx(64 * 1e-3, rel=1e-9)


def test_custom_grid_and_json() -> None:
    problem = benchmark_like(1)
    problem = MixtureProblem(
        problem.slopes,
        problem.current_losses,
        problem.reference_losses,
        problem.targets,
        problem.constraints,
        problem.horizon,
        SolverGrid(lambdas=(10.0, 100.0), epsilons=(0.0,)),
    )
    solution = solve(problem)
    assert solution.num_candidates == 2
    data = json.loads(json.dumps(solution.to_dict()))
    assert set(data) == {
        "weights", "objective", "lambda", "eps", "predicted_losses", "feasible", "max_violation",
        "lp_feasible", "lp_weights", "lp_objective", "num_candidates", "source",
    }  # fmt: skip
    assert data["source"] == "grid"
    assert data["weights"] == [float(x) for x in solution.weights]
    assert isinstance(data["feasible"], bool) and isinstance(data["lambda"], float)


def test_solution_arrays_are_read_only() -> None:
    solution = solve(benchmark_like(2))
    assert isinstance(solution, Solution)
    with pytest.raises(ValueError):
        solution.weights[0] = 1.0


def test_candidates_tied_up_to_rounding_go_to_the_earliest_grid_point():
    # The same mixture found at two grid points, its objective differing in the last digit
    # (one machine's rounding puts 4e-14 of weight where another puts 0): the earlier point
    # wins whichever of the two rounds lower, so the record is the same on every machine.
    def candidate(
        lam: float, eps: float, objective: float, violation: float = 0.0
    ) -> GridCandidate:
        return GridCandidate(lam, eps, np.array([0.0, 1.0]), objective, violation)

    for later in (-1.2, -1.2 * (1 + 1e-15), -1.2 * (1 - 1e-15)):
        chosen = _select(
            [candidate(1.0, 0.0, -1.0), candidate(20.9, 0.05, -1.2), candidate(6.2, 0.1, later)]
        )
        assert (chosen.lam, chosen.eps) == (20.9, 0.05)
    # A real difference still decides, and with nothing feasible the least violation first.
    assert _select([candidate(20.9, 0.05, -1.2), candidate(6.2, 0.1, -1.2001)]).lam == 6.2
    infeasible = [
        candidate(1.0, 0.0, -2.0, 0.3),
        candidate(2.0, 0.0, -1.0, 0.1),
        candidate(3.0, 0.0, -1.5, 0.1 * (1 + 1e-14)),
    ]
    assert _select(infeasible).lam == 3.0

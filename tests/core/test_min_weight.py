"""``method.floors.all``: every dataset keeps at least m of the mixture, and each solver
finds the optimum over the mixtures with w >= m.

References: brute force over a fine simplex grid restricted to w >= m (the objective of
eq. 3.4 written afresh in tests/core/test_solver.py, the robust program's own objective and
violations), and the toy learner for the policy.
"""

from __future__ import annotations

import numpy as np
import pytest

from dynamics.core.controller import run_mixture_training
from dynamics.core.policies import DynamicsPolicy
from dynamics.core.problem import FEASIBILITY_TOL, MixtureProblem, to_floored_simplex
from dynamics.core.robust import (
    RobustProblem,
    solve_direct,
)
from dynamics.core.rules import RuleSet, rule_set
from dynamics.core.schedules import build_schedule
from dynamics.core.solver import duality_gap, solve, solve_lp, solve_penalized
from tests.core.test_solver import make_problem, objectives_from_paper, simplex_grid
from tests.core.toy_learner import ToyLearner


def floored_grid(n: int, steps: int, m: float) -> np.ndarray:
    """The points of simplex_grid(n, steps) with every coordinate >= m, shape (n, P)."""
    points = simplex_grid(n, steps)
    return points[:, np.all(points >= m - 1e-12, axis=0)]


def assert_floored_mixture(w: np.ndarray, m: float) -> None:
    assert np.all(np.isfinite(w))
    assert w.min() >= m - 1e-15
    assert abs(w.sum() - 1.0) <= 1e-12


def random_problem(seed: int, n: int, slack: float = 0.05) -> MixtureProblem:
    rng = np.random.default_rng(seed)
    slopes = rng.normal(0.0, 2e-3, size=(4, n))
    current = rng.uniform(1.0, 3.0, size=4)
    reference = current + rng.uniform(-slack, slack, size=4)
    return make_problem(slopes, current, reference, (0, 1), (2, 3), 64.0)


def with_floor(problem: MixtureProblem, m: float) -> MixtureProblem:
    return MixtureProblem(
        problem.slopes,
        problem.current_losses,
        problem.reference_losses,
        problem.targets,
        problem.constraints,
        problem.horizon,
        problem.grid,
        min_weight=m,
    )


# ---------------------------------------------------------------- the problem


def test_min_weight_is_checked():
    problem = random_problem(0, 3)
    for bad in (-0.1, 0.34, float("nan")):
        with pytest.raises(ValueError, match="min_weight"):
            with_floor(problem, bad)
    with_floor(problem, 1 / 3)  # N m = 1: the uniform mixture only


@pytest.mark.parametrize("m", [0.05, 0.2, 1 / 3])
def test_the_problem_above_the_floor_predicts_the_same_losses(m: float):
    problem = with_floor(random_problem(1, 3), m)
    free = problem.above_floor()
    for v in np.random.default_rng(2).dirichlet(np.ones(3), size=20):
        w = problem.floored(v)
        assert_floored_mixture(w, m)
        np.testing.assert_allclose(
            free.predicted_losses(v), problem.predicted_losses(w), rtol=1e-13
        )
        expected = problem.target_objective(w) - m * problem.slopes[[0, 1]].sum()
        assert free.target_objective(v) == pytest.approx(expected, rel=1e-10, abs=1e-16)
        if m < 1 / 3:
            np.testing.assert_allclose(problem.unfloored(w), v, atol=1e-12)


# ---------------------------------------------------------------- the paper's solvers


@pytest.mark.parametrize(("n", "m"), [(2, 0.1), (2, 0.45), (3, 0.05), (3, 0.25)])
@pytest.mark.parametrize("seed", range(3))
def test_penalized_with_a_floor_matches_brute_force_above_it(n: int, m: float, seed: int):
    problem = with_floor(random_problem(seed, n), m)
    points = floored_grid(n, 600, m)
    for lam, eps in [(1.0, 0.0), (60.0, 0.05), (5000.0, 0.0), (5000.0, 0.1)]:
        w = solve_penalized(problem, lam, eps)
        assert_floored_mixture(w, m)
        ours = float(objectives_from_paper(problem, lam, eps, w[:, None])[0])
        best = float(objectives_from_paper(problem, lam, eps, points).min())
        scale = float(np.abs(problem.slopes).max())
        assert ours <= best + 1e-6 * max(abs(best), scale)
        assert best - ours <= 1e-2 * (abs(best) + scale)
        assert duality_gap(problem, lam, eps, w) <= 1e-6 * max(abs(ours), scale)


def test_the_floor_moves_the_unconstrained_vertex():
    slopes = np.array([[-3e-3, -1e-3, 0.0], [0.0, 0.0, 0.0]])
    problem = make_problem(slopes, np.array([2.0, 1.0]), np.array([np.nan, 1.0]), (0,), (1,), 64.0)
    np.testing.assert_allclose(solve(problem).weights, [1.0, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(solve(with_floor(problem, 0.1)).weights, [0.8, 0.1, 0.1], atol=1e-12)


@pytest.mark.parametrize(("n", "m"), [(2, 0.2), (3, 0.1), (3, 0.3)])
@pytest.mark.parametrize("seed", range(6))
def test_lp_with_a_floor_matches_brute_force_above_it(n: int, m: float, seed: int):
    problem = with_floor(random_problem(seed, n, slack=0.15), m)
    lp = solve_lp(problem)
    points = floored_grid(n, 300, m)
    c = list(problem.constraints)
    predicted = problem.current_losses[c, None] + problem.horizon * problem.slopes[c] @ points
    feasible = np.all(predicted <= problem.reference_losses[c, None], axis=0)
    g = problem.slopes[list(problem.targets)].sum(axis=0)
    if feasible.any():
        assert lp.feasible
    if lp.feasible:
        assert lp.weights is not None
        assert_floored_mixture(lp.weights, m)
        assert problem.max_violation(lp.weights) <= FEASIBILITY_TOL + 1e-12
        if feasible.any():
            assert lp.objective <= float((g @ points)[feasible].min()) + 1e-9
    else:
        assert not feasible.any()


def test_a_floor_can_make_the_lp_infeasible():
    # Only dataset 0 keeps the constraint; any weight on dataset 1 breaks it.
    slopes = np.array([[-1e-3, -2e-3], [0.0, 1e-3]])
    problem = make_problem(slopes, np.array([2.0, 1.0]), np.array([np.nan, 1.0]), (0,), (1,), 64.0)
    assert solve_lp(problem).feasible
    floored = with_floor(problem, 0.1)
    assert not solve_lp(floored).feasible
    solution = solve(floored)
    assert not solution.feasible
    np.testing.assert_allclose(solution.weights, [0.9, 0.1], atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_every_grid_candidate_and_the_record_keep_the_floor(seed: int):
    problem = with_floor(random_problem(seed, 5, slack=0.02), 0.08)
    solution = solve(problem)
    assert_floored_mixture(solution.weights, 0.08)
    record = solution.to_dict()
    assert record["min_weight"] == 0.08
    assert "min_weight" not in solve(random_problem(seed, 5, slack=0.02)).to_dict()


# ---------------------------------------------------------------- the robust direct candidate


def robust_case(seed: int) -> tuple[MixtureProblem, np.ndarray]:
    rng = np.random.default_rng(seed)
    slopes = rng.normal(0.0, 1e-3, size=(3, 3))
    slopes[0, 0] = -2e-3  # dataset 0 alone takes the target past its floor below
    current = np.array([2.0, 1.0, 1.5])
    reference = np.array([np.nan, 1.0 + 0.1 * rng.uniform(), 1.5 + 0.1 * rng.uniform()])
    problem = MixtureProblem(slopes, current, reference, (0,), (1, 2), horizon=64, min_weight=0.15)
    return problem, np.abs(rng.normal(0.0, 3e-4, size=(3, 3)))


ROBUST_KINDS = {
    "linear": {},
    "pessimistic": {"target_z": 1.0},
    "tempered": {"gain_exponent": 0.5, "probe_budget": 8},
}


@pytest.mark.parametrize("kind", sorted(ROBUST_KINDS))
@pytest.mark.parametrize("seed", range(5))
def test_direct_candidate_with_a_floor_matches_brute_force_above_it(kind: str, seed: int):
    problem, errors = robust_case(seed)
    rp = RobustProblem(problem, errors, **ROBUST_KINDS[kind])
    assert rp.nonlinear_prediction == (kind == "tempered")
    direct = solve_direct(rp)
    assert_floored_mixture(direct.weights, 0.15)
    points = floored_grid(3, 150, 0.15).T
    worst = np.array([rp.violations(w).max() for w in points])
    if direct.feasible:
        assert rp.max_violation(direct.weights) <= FEASIBILITY_TOL
        assert (
            rp.objective(direct.weights) <= min(rp.objective(w) for w in points[worst <= 0]) + 1e-7
        )
    else:
        assert worst.min() > -1e-6
        assert rp.violations(direct.weights).max() <= worst.min() + 1e-6


def test_to_floored_simplex_is_to_simplex_without_a_floor_and_clips_to_the_floor():
    w = np.array([0.5, -1e-17, 0.5000000001])
    np.testing.assert_array_equal(
        to_floored_simplex(w, 0.0), np.clip(w, 0, None) / np.clip(w, 0, None).sum()
    )
    floored = to_floored_simplex(np.array([0.6, 0.05, 0.35]), 0.1)
    assert_floored_mixture(floored, 0.1)
    np.testing.assert_allclose(floored, [0.1 + 0.7 * 0.5 / 0.75, 0.1, 0.1 + 0.7 * 0.25 / 0.75])


# ---------------------------------------------------------------- the policy


SLOPES = np.array([[-0.010, -0.001, 0.000], [0.004, -0.001, 0.000], [0.001, -0.0005, 0.0]])


@pytest.mark.parametrize(
    "options",
    [rule_set(), rule_set(lp_candidate=True, target_noise=1.0, gain_exponent=0.5)],
)
def test_policy_updates_keep_the_floor_and_say_so(options: RuleSet):
    schedule = build_schedule([0, 8, 16, 32], 64, probe_cap=8)
    learner = ToyLearner(SLOPES, np.array([3.0, 1.0, 1.0]))
    policy = DynamicsPolicy(schedule, rules=options, min_weight=0.2)
    history = run_mixture_training(
        learner, policy, targets=[0], constraints=[1, 2], eval_interval=16, reduced_batches=4
    )
    assert len(history.updates) == 4
    for update in history.updates:
        assert_floored_mixture(update.weights, 0.2)
        assert update.solver["min_weight"] == 0.2
    # Without the floor the same run leaves dataset 2 (it teaches nothing) at 0.
    free = run_mixture_training(
        ToyLearner(SLOPES, np.array([3.0, 1.0, 1.0])),
        DynamicsPolicy(schedule, rules=options),
        targets=[0],
        constraints=[1, 2],
        eval_interval=16,
        reduced_batches=4,
    )
    assert any(u.weights.min() < 0.2 for u in free.updates)
    assert all("min_weight" not in u.solver for u in free.updates)

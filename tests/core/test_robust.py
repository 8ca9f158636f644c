"""The robustness options beyond the paper (``dynamics.core.robust``), each mechanism alone.

References: brute force over a fine simplex grid for the direct (pessimistic) program, HiGHS for
its linear case, the closed-form sample standard deviation for the slope errors, and the
analytic toy learner for the policy.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamics.core.controller import run_mixture_training
from dynamics.core.decisions import slope_standard_errors
from dynamics.core.policies import DynamicsPolicy
from dynamics.core.problem import FEASIBILITY_TOL, MixtureProblem
from dynamics.core.robust import (
    RobustProblem,
    predicted_changes,
    select_robust,
    solve_direct,
    tempered_progress,
)
from dynamics.core.rules import RuleSet, rule_set
from dynamics.core.schedules import build_schedule
from dynamics.core.solver import grid_candidates, solve, solve_lp
from tests.core.toy_learner import ToyLearner

SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def simplex_grid(n: int, resolution: int) -> np.ndarray:
    """Every point of the simplex with coordinates in multiples of 1/resolution, (P, n)."""
    points = [
        c for c in itertools.product(range(resolution + 1), repeat=n - 1) if sum(c) <= resolution
    ]
    return np.array([[*c, resolution - sum(c)] for c in points], dtype=float) / resolution


def random_problem(seed: int, n: int = 3, slack: float = 0.05) -> tuple[MixtureProblem, np.ndarray]:
    rng = np.random.default_rng(seed)
    slopes = rng.normal(0.0, 1e-3, size=(3, n))
    current = np.array([2.0, 1.0, 1.5])
    reference = np.array([np.nan, 1.0 + slack * rng.uniform(), 1.5 + slack * rng.uniform()])
    problem = MixtureProblem(
        slopes, current, reference, targets=(0,), constraints=(1, 2), horizon=64
    )
    errors = np.abs(rng.normal(0.0, 3e-4, size=(3, n)))
    return problem, errors


# ------------------------------------------------------------- slope errors


def test_slope_errors_are_the_paired_standard_error_per_step():
    rng = np.random.default_rng(0)
    anchor = rng.normal(size=(2, 5))
    probed = anchor[None] + rng.normal(0.1, 0.2, size=(3, 2, 5))
    errors = slope_standard_errors(anchor, probed, probe_budget=16)
    for j, i in itertools.product(range(3), range(2)):
        change = probed[j, i] - anchor[i]
        expected = np.sqrt(((change - change.mean()) ** 2).sum() / 4) / np.sqrt(5) / 16
        assert errors[i, j] == pytest.approx(expected, rel=1e-12)


def test_slope_errors_ignore_batch_offsets_that_the_probe_does_not_change():
    # Batches differ a lot, but a probe that shifts every batch by the same amount has an
    # exactly known slope: paired differences have no spread.
    anchor = np.array([[0.0, 5.0, -3.0, 1.0]])
    probed = (anchor + 0.25)[None]
    np.testing.assert_allclose(slope_standard_errors(anchor, probed, 4), 0.0, atol=1e-15)


def test_slope_errors_with_one_batch_are_zero_not_nan():
    errors = slope_standard_errors(np.ones((2, 1)), np.zeros((3, 2, 1)), 8)
    assert errors.shape == (2, 3) and np.all(errors == 0.0)


# ------------------------------------------------------------- checked inputs


def test_negative_target_noise_and_bad_errors_are_refused():
    problem, errors = random_problem(0)
    with pytest.raises(ValueError, match="target_noise"):
        rule_set(target_noise=-1.0)
    with pytest.raises(ValueError, match="slope_errors"):
        RobustProblem(problem, -errors)
    with pytest.raises(ValueError, match="slope_errors"):
        RobustProblem(problem, errors[:, :2])


# ------------------------------------------------------------- the direct candidate


def test_direct_candidate_without_noise_is_the_lp_optimum():
    for seed in range(20):
        problem, errors = random_problem(seed)
        lp = solve_lp(problem)
        direct = solve_direct(RobustProblem(problem, errors))
        assert direct.feasible == lp.feasible
        if lp.feasible:
            # solve_lp allows FEASIBILITY_TOL of violation, the direct candidate none: equal up
            # to what that tolerance buys (slopes are ~1e-3 per step, the horizon 64).
            assert problem.target_objective(direct.weights) == pytest.approx(
                lp.objective, abs=1e-10
            )


def test_lp_candidate_recovers_the_feasible_interior_mixture_the_grid_misses():
    """The toy of the issue: early in a dense warmup H |S| is far below every eps > 0, and
    the eps = 0 candidates stop just past the boundary, so the paper's rule falls back to the
    safest vertex. The LP optimum mixes, keeps every constraint and improves the target."""
    slopes = np.array([[-0.010, -0.001, 0.000], [0.004, -0.001, 0.000], [0.001, -0.0005, 0.0]])
    current = np.array([3.0, 2.0, 2.5])
    problem = MixtureProblem(slopes, current, np.array([np.nan, 2.0, 2.5]), (0,), (1, 2), horizon=2)
    paper = solve(problem)
    np.testing.assert_allclose(paper.weights, [0.0, 1.0, 0.0], atol=1e-9)
    rp = RobustProblem(problem, np.zeros_like(slopes))
    choice = select_robust(
        rp, [c.weights for c in grid_candidates(problem)], [solve_direct(rp).candidate()]
    )
    assert choice.source == "direct" and choice.feasible
    np.testing.assert_allclose(choice.weights, [0.2, 0.8, 0.0], atol=1e-9)
    assert problem.target_objective(choice.weights) < problem.target_objective(paper.weights)


def test_candidates_whose_objectives_differ_by_rounding_alone_are_tied_and_the_first_is_kept():
    # Two grid points that reach the same mixture, one a rounding error further along: the
    # later one has the lower objective by rounding alone, and the first one is kept; a
    # mixture better by more than rounding still wins.
    slopes = np.array([[-0.010, -0.001, 0.000], [0.004, -0.001, 0.000], [0.001, -0.0005, 0.0]])
    problem = MixtureProblem(
        slopes, np.array([3.0, 2.0, 2.5]), np.array([np.nan, 2.1, 2.6]), (0,), (1, 2), horizon=2
    )
    rp = RobustProblem(problem, np.zeros_like(slopes))
    first = np.array([0.5, 0.5, 0.0])
    rounded = np.array([0.5 + 1e-15, 0.5 - 1e-15, 0.0])
    assert rp.objective(rounded) < rp.objective(first)  # the case happens
    assert select_robust(rp, [first, rounded]).index == 0
    better = np.array([0.6, 0.4, 0.0])
    assert rp.objective(better) < rp.objective(first) and rp.max_violation(better) <= 0
    assert select_robust(rp, [first, rounded, better]).index == 2


@settings(max_examples=12, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), zt=st.sampled_from([0.5, 1.0, 2.0]))
def test_direct_pessimistic_candidate_matches_brute_force(seed: int, zt: float):
    problem, errors = random_problem(seed, slack=0.1)
    rp = RobustProblem(problem, errors, target_z=zt)
    direct = solve_direct(rp)
    points = simplex_grid(3, 150)
    worst = np.array([rp.violations(w).max() for w in points])
    assert direct.max_violation >= 0.0
    if direct.feasible:
        assert rp.max_violation(direct.weights) <= FEASIBILITY_TOL
        best = min(rp.objective(w) for w in points[worst <= 0])
        # The grid's best is feasible, so the exact optimum is at least as good (up to a
        # solver tolerance far below the slopes' size of 1e-3).
        assert rp.objective(direct.weights) <= best + 1e-7
    else:
        assert worst.min() > -1e-6  # brute force finds nothing clearly feasible either
        assert rp.violations(direct.weights).max() <= worst.min() + 1e-6


def test_a_stuck_broken_constraint_does_not_hide_the_others():
    """Constraint 1 is already broken and no dataset moves it (an accuracy that a short probe
    does not change): every mixture ties on the largest violation. The paper's rule then
    takes the best target objective, the smallest lambda's candidate, nearly all on
    dataset 0, which breaks constraint 2 as well.
    The lexicographic fallback keeps constraint 2 and improves the target within it."""
    slopes = np.array([[-1e-3, 0.0, 0.0], [0.0, 0.0, 0.0], [1e-3, -1e-3, 0.0]])
    problem = MixtureProblem(
        slopes,
        np.array([2.0, -0.80, 1.0]),
        np.array([np.nan, -0.85, 1.0]),
        (0,),
        (1, 2),
        horizon=16,
    )
    paper = solve(problem)
    assert paper.weights[0] > 0.95
    assert problem.violations(paper.weights)[1] > 0.01
    rp = RobustProblem(problem, np.zeros_like(slopes))
    direct = solve_direct(rp)
    assert not direct.feasible and direct.max_violation == pytest.approx(0.05)
    np.testing.assert_allclose(direct.weights, [0.5, 0.5, 0.0], atol=1e-6)
    choice = select_robust(rp, [c.weights for c in grid_candidates(problem)], [direct.candidate()])
    assert problem.violations(choice.weights)[1] <= 1e-6
    assert problem.target_objective(choice.weights) == pytest.approx(-0.5e-3, abs=1e-8)


def test_the_fallback_does_not_flip_under_evaluations_a_billionth_apart():
    """Constraint 1 is broken and stuck, so every mixture is infeasible. The most feasible
    point is dataset 0 alone (it helps constraint 2 and teaches nothing); the best mixture
    within the same violations shares the weight with dataset 1, the target's teacher, up to
    where constraint 2 binds. That answer sits on the solver's bound: checked against the
    same bound, rounding decided whether it was kept or the run stayed on dataset 0."""
    slopes = np.array([[0.0, -1e-3, -1e-4], [0.0, 0.0, 0.0], [-1e-3, 1e-3, 0.0]])
    rng = np.random.default_rng(0)
    answers = []
    for _ in range(20):
        nudged = slopes * (1 + 1e-9 * rng.normal(size=slopes.shape))
        current = np.array([2.0, -0.80, 1.0]) * (1 + 1e-9 * rng.normal(size=3))
        problem = MixtureProblem(
            nudged, current, np.array([np.nan, -0.85, 1.0]), (0,), (1, 2), horizon=16
        )
        direct = solve_direct(
            RobustProblem(problem, np.full_like(slopes, 1e-4), gain_exponent=0.5, probe_budget=4)
        )
        assert not direct.feasible
        answers.append(direct.weights)
    answers = np.array(answers)
    assert np.ptp(answers, axis=0).max() < 1e-5
    assert 0.4 < answers[0, 1] < 0.55  # the target's teacher up to constraint 2's bound


def test_target_noise_shares_weight_between_datasets_within_noise():
    # Two datasets teach the target equally well up to a difference far below their
    # standard errors; no constraint binds. The paper's objective puts everything on the
    # marginally better one, the pessimistic one splits the weight.
    slopes = np.array([[-1.00e-3, -0.99e-3, 0.0], [0.0, 0.0, 0.0]])
    problem = MixtureProblem(
        slopes, np.array([2.0, 1.0]), np.array([np.nan, 1.0]), (0,), (1,), horizon=64
    )
    errors = np.array([[2e-4, 2e-4, 1e-5], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(solve(problem).weights, [1.0, 0.0, 0.0], atol=1e-9)
    direct = solve_direct(RobustProblem(problem, errors, target_z=1.0))
    assert direct.feasible
    assert 0.3 < direct.weights[0] < 0.7 and 0.3 < direct.weights[1] < 0.7
    assert direct.weights[2] < 0.05


def test_target_noise_needs_the_direct_candidate():
    assert rule_set(lp_candidate=True, target_noise=1.0).value("target_noise") == 1.0
    with pytest.raises(ValueError, match=r"method\.lp_candidate, which is off"):
        rule_set(target_noise=1.0)
    assert RuleSet.of_variant("paper").is_paper and not RuleSet.of_variant("robust").is_paper


# ------------------------------------------------------------- diminishing returns


def test_tempered_progress_is_the_line_up_to_one_probe_then_a_concave_power():
    u = np.linspace(0.0, 12.0, 1201)
    for p in (0.25, 0.5, 0.9):
        phi = tempered_progress(u, p)
        np.testing.assert_array_equal(phi[u <= 1.0], u[u <= 1.0])
        assert np.all(phi[u > 1.0] < u[u > 1.0])  # it only tempers the extrapolation
        assert np.all(np.diff(phi) > 0)  # more steps never predict less
        slopes = np.diff(phi) / np.diff(u)
        assert np.all(np.diff(slopes) <= 1e-12)  # concave
        # continuous with its slope at the probe's end
        assert slopes[99] == pytest.approx(1.0, abs=1e-2) and slopes[100] == pytest.approx(
            1.0, abs=1e-2
        )
    np.testing.assert_array_equal(tempered_progress(u, 1.0), u)
    assert tempered_progress(np.array([4.0]), 0.5)[0] == pytest.approx(3.0)  # 1 + (2 - 1) / 0.5


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 10_000),
    p=st.sampled_from([0.3, 0.5, 0.8]),
    budget=st.sampled_from([4, 16, 64]),
)
def test_diminishing_returns_are_never_more_optimistic_than_the_line(
    seed: int, p: float, budget: int
):
    problem, _ = random_problem(seed)
    w = np.random.default_rng(seed).dirichlet(np.ones(3))
    linear = problem.horizon * problem.slopes @ w
    tempered = predicted_changes(problem, w, p, budget)
    assert np.all(tempered >= linear - 1e-15)
    np.testing.assert_array_equal(predicted_changes(problem, w, 1.0, budget), linear)
    if problem.horizon * w.max() <= budget:  # no dataset trains longer than its probe
        np.testing.assert_allclose(tempered, linear, rtol=1e-12, atol=1e-15)


def test_diminishing_returns_share_weight_when_no_constraint_binds():
    # Each dataset teaches its own target and slightly harms the other; dataset 1 is a bit
    # better. Linear: all on dataset 1 (a vertex). Tempered: both, as training on both
    # targets would do; the optimum matches brute force on the tempered objective.
    slopes = np.array([[-0.010, 0.002], [0.001, -0.012]])
    problem = MixtureProblem(
        slopes, np.array([1.0, 1.0]), np.full(2, np.nan), (0, 1), (), horizon=128
    )
    linear = solve_direct(RobustProblem(problem, np.zeros_like(slopes), probe_budget=16))
    np.testing.assert_allclose(linear.weights, [0.0, 1.0], atol=1e-9)
    rp = RobustProblem(problem, np.zeros_like(slopes), gain_exponent=0.5, probe_budget=16)
    direct = solve_direct(rp)
    assert direct.feasible and 0.3 < direct.weights[0] < 0.6
    best = min(rp.objective(w) for w in simplex_grid(2, 1000))
    assert rp.objective(direct.weights) <= best + 1e-9
    # Within one probe length the prediction is the line's: the vertex again.
    short = RobustProblem(problem, np.zeros_like(slopes), gain_exponent=0.5, probe_budget=128)
    np.testing.assert_allclose(solve_direct(short).weights, [0.0, 1.0], atol=1e-6)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), p=st.sampled_from([0.3, 0.5]))
def test_tempered_direct_candidate_matches_brute_force(seed: int, p: float):
    problem, errors = random_problem(seed, slack=0.1)
    rp = RobustProblem(problem, errors, gain_exponent=p, probe_budget=8)
    direct = solve_direct(rp)
    points = simplex_grid(3, 150)
    worst = np.array([rp.violations(w).max() for w in points])
    if direct.feasible:
        assert rp.max_violation(direct.weights) <= FEASIBILITY_TOL
        assert (
            rp.objective(direct.weights) <= min(rp.objective(w) for w in points[worst <= 0]) + 1e-7
        )
    else:
        assert worst.min() > -1e-6
        assert rp.violations(direct.weights).max() <= worst.min() + 1e-6


def test_gain_exponent_is_checked_and_needs_the_direct_candidate():
    assert rule_set(lp_candidate=True, gain_exponent=0.5).value("gain_exponent") == 0.5
    with pytest.raises(ValueError, match=r"method\.lp_candidate, which is off"):
        rule_set(gain_exponent=0.5)
    assert rule_set(gain_exponent=1.0).is_paper
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match="gain_exponent"):
            rule_set(gain_exponent=bad)


def test_tempered_policy_ends_lower_on_targets_with_saturating_returns():
    # Two targets, each taught by its own dataset with returns that saturate (the square
    # root of the steps trained on it), no constraint. Linear predictions put all weight on
    # one dataset at every update; the tempered ones share it, and the summed target loss
    # ends lower.
    slopes = np.array([[-0.02, 0.0], [0.0, -0.02]])

    def effect(steps):
        return -0.04 * np.sqrt(np.maximum(steps, 0.0)) * np.array([1.0, 1.1])

    schedule = build_schedule([0, 8, 16, 32, 64], 128, probe_cap=8)
    finals, updates = {}, {}
    for p in (1.0, 0.5):
        learner = ToyLearner(slopes, np.array([3.0, 3.0]), effect=effect)
        policy = DynamicsPolicy(schedule, rules=rule_set(lp_candidate=True, gain_exponent=p))
        history = run_mixture_training(
            learner, policy, targets=[0, 1], constraints=[], eval_interval=32, reduced_batches=4
        )
        finals[p] = history.evaluations[-1].eval.sum()
        updates[p] = history.updates
    assert all(min(u.weights) < 1e-6 for u in updates[1.0])
    long_horizon = [u for u in updates[0.5] if u.horizon > u.probe_budget]
    assert long_horizon and all(min(u.weights) > 0.1 for u in long_horizon)
    assert finals[0.5] < finals[1.0]


# ------------------------------------------------------------- the policy on the toy learner

SLOPES = np.array([[-0.010, -0.001, 0.000], [0.004, -0.001, 0.000], [0.001, -0.0005, 0.0]])
INITIAL = np.array([3.0, 2.0, 2.5])


def run(policy, learner):
    return run_mixture_training(
        learner, policy, targets=[0], constraints=[1, 2], eval_interval=32, reduced_batches=4
    )


def test_paper_variant_records_are_unchanged_by_the_options_code():
    paper = run(DynamicsPolicy(build_schedule("dense-warmup", 128)), ToyLearner(SLOPES, INITIAL))
    for update in paper.updates:
        assert update.rules is None and "robust" not in update.to_dict()["extra"]
        assert update.solver["source"] == "grid"
        # The toy's per-batch offsets cancel in paired differences: exact slopes, no spread.
        np.testing.assert_allclose(update.slope_errors, 0.0, atol=1e-12)


def test_robust_variant_keeps_constraints_and_beats_the_papers_target_on_the_toy():
    schedule = build_schedule("dense-warmup", 128)
    histories = {}
    for variant in ("paper", "robust"):
        learner = ToyLearner(SLOPES, INITIAL)
        histories[variant] = run(
            DynamicsPolicy(schedule, rules=RuleSet.of_variant(variant)), learner
        )
    robust = histories["robust"]
    first, last = robust.evaluations[0], robust.evaluations[-1]
    assert np.all(last.eval[1:] <= first.eval[1:] + 1e-9)
    assert last.eval[0] < histories["paper"].evaluations[-1].eval[0]
    assert any(u.rules.choice.source == "direct" for u in robust.updates)
    for update in robust.updates:
        assert update.rules.choice.feasible

"""Decisions under measured noise: what each option beyond the paper does when evaluations
are noisy (``dynamics.core.robust``: metric floors, confident steps, target share, the
binomial floor of accuracy errors, tighten-only calibration, a failed solve).

The toy learner's noise is known (``noise``: the standard deviation of fresh per-batch
draws at every evaluation), so each test can say what a decision should and should not
react to.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import OptimizeResult

from dynamics.core import policies as policies_module
from dynamics.core import robust as robust_module
from dynamics.core.controller import run_mixture_training
from dynamics.core.decisions import (
    DatasetCalibration,
    PredictionCalibration,
    binomial_error,
    confident_step,
    dataset_calibrated,
    general_fallback,
    keep_target_share,
    slope_standard_errors,
    warmup_room,
)
from dynamics.core.learner import DomainKind, Evaluation
from dynamics.core.options import VARIANTS, RobustOptions
from dynamics.core.policies import DynamicsPolicy
from dynamics.core.probes import PerturbedEvaluations, ProbeRuns, probe_datasets, probe_in_turn
from dynamics.core.problem import FEASIBILITY_TOL, MixtureProblem
from dynamics.core.resolution import at_resolution, with_answer_tolerance
from dynamics.core.robust import RobustProblem, select_robust, solve_direct
from dynamics.core.schedules import build_schedule
from dynamics.core.solver import grid_candidates
from tests.core.toy_learner import ToyLearner

ROBUST_ALONE = replace(VARIANTS["robust"], answer_tolerance=0.0, target_floor=0.0)
"""The robust variant without its answer tolerance and target floor, which would mask what the
tests built on it show (a fallback, an accuracy read two ways, a drift)."""

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def largest_move(history) -> float:
    """The largest L1 change of the mixture between consecutive updates (2: vertex to vertex)."""
    weights = [u.weights for u in history.updates]
    return max(float(np.abs(b - a).sum()) for a, b in itertools.pairwise(weights))


# ------------------------------------------------------------- standard errors of accuracies


def test_an_accuracy_whose_answers_do_not_flip_keeps_its_binomial_error():
    # Four batches of 25 questions at 80% accuracy; the probe flips no answer, so the paired
    # spread is 0. A loss domain with the same zero spread keeps a zero error.
    anchor = np.array([[-0.8, -0.76, -0.84, -0.8], [2.0, 2.1, 1.9, 2.0]])
    probed = anchor[None].repeat(2, axis=0)
    kinds = [DomainKind("accuracy", 25), DomainKind("loss", 25)]
    errors = slope_standard_errors(anchor, probed, probe_budget=8, kinds=kinds)
    smoothed = (0.8 * 100 + 1) / 102
    np.testing.assert_allclose(errors[0], math.sqrt(smoothed * (1 - smoothed) / 100) / 8)
    np.testing.assert_array_equal(errors[1], 0.0)
    np.testing.assert_array_equal(slope_standard_errors(anchor, probed, probe_budget=8), 0.0)


@given(st.integers(1, 500), st.floats(0.0, 1.0))
@SETTINGS
def test_binomial_error_is_positive_and_at_most_that_of_a_coin(questions: int, accuracy: float):
    error = binomial_error(accuracy, questions)
    assert 0 < error <= 0.5 / math.sqrt(questions) + 1e-12


def test_a_measured_spread_above_the_binomial_floor_is_kept():
    anchor = np.full((1, 4), -0.5)
    probed = (anchor + np.array([0.2, -0.2, 0.3, -0.1]))[None]
    errors = slope_standard_errors(anchor, probed, probe_budget=1, kinds=[DomainKind("accuracy", 100)])
    assert errors[0, 0] == pytest.approx(np.std([0.2, -0.2, 0.3, -0.1], ddof=1) / 2)


# ------------------------------------------------------------- calibration only tightens


@given(st.lists(st.tuples(st.floats(-1, 1), st.integers(1, 128)), min_size=1, max_size=12), st.integers(1, 256))
@SETTINGS
def test_calibration_never_loosens_a_constraint(errors: list[tuple[float, int]], horizon: int):
    calibration = PredictionCalibration(1)
    for error, past_horizon in errors:
        calibration.observe(np.array([0.0]), np.array([error]), past_horizon)
    assert calibration.bias(horizon)[0] >= 0.0


# ------------------------------------------------------------- calibration per dataset


@given(
    st.lists(
        st.tuples(st.floats(-1, 1), st.integers(1, 128), st.lists(st.floats(0, 1), min_size=3, max_size=3)),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 256),
)
@SETTINGS
def test_dataset_calibration_never_loosens_a_constraint(observed, horizon: int):
    calibration = DatasetCalibration(1, 3)
    for error, past_horizon, weights in observed:
        calibration.observe(np.array([0.0]), np.array([error]), past_horizon, np.array(weights))
    assert np.all(calibration.correction(horizon) >= 0.0)


@pytest.mark.parametrize("horizons", [[16], [1, 2, 4, 32], [64, 8]])
def test_on_one_uniform_mixture_the_dataset_correction_is_the_constant_calibration(horizons: list[int]):
    # The constant bias is the case of one correction shared by every dataset: trained on
    # the uniform mixture only, both learn the same per-step correction of the prediction.
    rng = np.random.default_rng(0)
    uniform = np.full(4, 0.25)
    constant, per_dataset = PredictionCalibration(2), DatasetCalibration(2, 4)
    for horizon in horizons:
        realized = np.abs(rng.normal(0.0, 0.05, size=2))
        constant.observe(np.zeros(2), realized, horizon)
        per_dataset.observe(np.zeros(2), realized, horizon, uniform)
    for predicted_horizon in (1, 32, 128):
        correction = per_dataset.correction(predicted_horizon)
        np.testing.assert_allclose(correction @ uniform, constant.bias(predicted_horizon), rtol=1e-10)
        np.testing.assert_allclose(correction, correction[:, :1].repeat(4, axis=1), rtol=1e-10)


def test_dataset_calibration_tells_the_datasets_apart_from_different_mixtures():
    # Horizons of 64 steps on four different mixtures, each missing its prediction by the
    # true per-step correction B applied to the steps trained; predicted 1 step ahead the
    # prior is negligible and B comes back, and a dataset never trained gets nothing.
    true = np.array([[0.0, 0.0, 0.0, 0.0], [2e-3, 0.0, 5e-4, 0.0]])
    calibration = DatasetCalibration(2, 4)
    for weights in ([1, 0, 0, 0], [0.5, 0.5, 0, 0], [0, 0.3, 0.7, 0], [0.2, 0.2, 0.6, 0]):
        steps = 64 * np.array(weights, dtype=float)
        calibration.observe(np.zeros(2), true @ steps, 64, np.array(weights, dtype=float))
    correction = calibration.correction(1)
    np.testing.assert_allclose(correction, true, atol=2e-6)
    assert correction[1, 3] == 0.0
    assert DatasetCalibration.from_state_dict(calibration.state_dict()).correction(32).tolist() == (
        calibration.correction(32).tolist()
    )


def test_a_dataset_correction_raises_only_constraint_slopes():
    problem = accuracy_problem()
    correction = np.array([[1.0, 1.0], [3e-4, 1e-4]])
    corrected = dataset_calibrated(problem, correction)
    np.testing.assert_array_equal(corrected.slopes[0], problem.slopes[0])
    np.testing.assert_allclose(corrected.slopes[1], problem.slopes[1] + correction[1])


def test_dataset_calibration_and_calibration_are_one_or_the_other():
    with pytest.raises(ValueError, match="set calibration: false"):
        RobustOptions(calibration=True, dataset_calibration=True)


# A constraint measured like an accuracy over 50 questions (steps of 0.02): dataset 0, the
# best for the target, costs it 4e-4 per step, so a 4-step probe rarely flips a question
# and its slope reads 0, while 64 steps flip one or two. Dataset 1 teaches the target a
# little less and costs the constraint nothing; dataset 2 teaches the target nothing.
QUANTIZED_SLOPES = np.array([[-3e-3, -2e-3, 0.0], [4e-4, 0.0, -1e-4]])


def quantized(steps: np.ndarray) -> np.ndarray:
    values = QUANTIZED_SLOPES @ steps
    values[1] = 0.02 * np.floor(values[1] / 0.02 + 0.5)
    return values


def quantized_run(options: RobustOptions, seed: int):
    learner = ToyLearner(QUANTIZED_SLOPES, NOISY_INITIAL, seed=seed, noise=0.002, effect=quantized)
    schedule = build_schedule([0, 8, 16, 32, 64, 96, 128, 160, 192, 224], 256, probe_cap=4)
    policy = DynamicsPolicy(schedule, options=options)
    history = run_mixture_training(learner, policy, targets=[0], constraints=[1], eval_interval=32, reduced_batches=4)
    return history, learner.values()[1] - NOISY_INITIAL[1]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_harm_only_long_stretches_show_is_learned_and_charged_to_its_dataset(seed: int):
    # The paper's method and the constant calibration end two questions above the
    # constraint's start; charging the realized harm to the datasets trained on keeps it
    # lower, by moving weight off dataset 0 rather than off every dataset alike.
    _, paper_end = quantized_run(RobustOptions(), seed)
    _, constant_end = quantized_run(RobustOptions(calibration=True), seed)
    history, end = quantized_run(RobustOptions(dataset_calibration=True), seed)
    assert end <= min(paper_end, constant_end) - 0.02 + 1e-9
    last = np.asarray(history.updates[-1].extra["dataset_calibration"])
    assert last[1, 0] > 0.0 and np.all(last[0] == 0.0)  # the target's own row is never corrected
    before = np.mean([u.weights[0] for u in quantized_run(RobustOptions(), seed)[0].updates[4:]])
    after = np.mean([u.weights[0] for u in history.updates[4:]])
    assert after < before


# ------------------------------------------------------------- metric floors


def accuracy_problem() -> MixtureProblem:
    # Domain 1 is an accuracy of 90% (value -0.9). Dataset 0's probe extrapolates to +100
    # points of accuracy over the horizon, dataset 1 costs 40 points.
    slopes = np.array([[-1e-3, 0.0], [-1e-2, 4e-3]])
    return MixtureProblem(slopes, np.array([2.0, -0.9]), np.array([np.nan, -0.9]), (0,), (1,), horizon=100)


def test_floors_stop_an_impossible_gain_from_offsetting_a_real_harm():
    problem = accuracy_problem()
    half = np.array([0.5, 0.5])
    linear = RobustProblem(problem, np.zeros((2, 2)))
    floored = RobustProblem(problem, np.zeros((2, 2)), floors=np.array([0.0, -1.0]))
    # Linear: -0.9 - 0.5 + 0.2 = -1.2, an accuracy of 120%, "feasible".
    assert linear.predicted_losses(half)[1] == pytest.approx(-1.2)
    assert linear.max_violation(half) == 0.0
    # Floored: dataset 0 can add at most the 10 points left, dataset 1 still costs 20.
    assert floored.predicted_losses(half)[1] == pytest.approx(-0.9 - 0.1 + 0.2)
    assert floored.max_violation(half) == pytest.approx(0.1)
    assert floored.nonlinear_prediction and not linear.nonlinear_prediction


def test_floors_that_no_gain_can_reach_leave_the_prediction_linear():
    problem = accuracy_problem()
    far = RobustProblem(problem, np.zeros((2, 2)), floors=np.array([-100.0, -100.0]))
    assert far.floors is None and not far.nonlinear_prediction


@given(st.integers(0, 10_000), st.floats(0.05, 1.0))
@SETTINGS
def test_floors_never_predict_a_value_below_the_floor_from_gains_alone(seed: int, scale: float):
    rng = np.random.default_rng(seed)
    slopes = -np.abs(rng.normal(0.0, scale * 1e-2, size=(2, 3)))  # every entry a gain
    current = np.array([0.5, -0.6])
    problem = MixtureProblem(slopes, current, np.array([np.nan, -0.6]), (0,), (1,), horizon=200)
    floors = np.array([0.0, -1.0])
    rp = RobustProblem(problem, np.zeros((2, 3)), floors=floors)
    w = rng.dirichlet(np.ones(3))
    # Each dataset's gain stops at the floor, so the sum of N of them stops at N floors' room.
    assert np.all(rp.predicted_losses(w) >= current + 3 * (floors - current) - 1e-12)
    assert np.all(rp.predicted_losses(w) >= problem.predicted_losses(w) - 1e-12)


# ------------------------------------------------------------- confident steps


def two_dataset_problem(gap: float, error: float, reference: float = 1.2):
    # Datasets 0 and 1 teach the target; dataset 1 slightly better by ``gap`` per step.
    slopes = np.array([[-1e-3, -1e-3 - gap], [1e-4, 1e-4]])
    problem = MixtureProblem(slopes, np.array([2.0, 1.0]), np.array([np.nan, reference]), (0,), (1,), horizon=64)
    return RobustProblem(problem, np.array([[error, error], [0.0, 0.0]]))


def test_a_gain_within_noise_moves_the_mixture_a_little_and_a_clear_one_all_the_way():
    previous, proposed = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    within, fraction = confident_step(two_dataset_problem(gap=1e-5, error=1e-4), previous, proposed, full_step_z=2.0)
    # gain 1e-5 over an error of sqrt(2) * 1e-4: 0.0707 standard errors of the 2 asked for.
    assert fraction == pytest.approx(1e-5 / (2.0 * math.sqrt(2) * 1e-4))
    np.testing.assert_allclose(within, [1 - fraction, fraction])
    clear, fraction = confident_step(two_dataset_problem(gap=1e-3, error=1e-4), previous, proposed, full_step_z=2.0)
    assert fraction == 1.0
    np.testing.assert_allclose(clear, proposed)
    noiseless, fraction = confident_step(two_dataset_problem(gap=1e-6, error=0.0), previous, proposed, full_step_z=2.0)
    assert fraction == 1.0
    np.testing.assert_allclose(noiseless, proposed)


def test_a_confident_step_goes_as_far_as_the_constraints_need():
    # Dataset 0 (in force) breaks the constraint over the horizon, dataset 1 does not; the
    # target gain of switching is within noise, but the constraint forces most of the step.
    slopes = np.array([[-1e-3, -1e-3 - 1e-6], [1e-2, -1e-3]])
    problem = MixtureProblem(slopes, np.array([2.0, 1.0]), np.array([np.nan, 1.0]), (0,), (1,), horizon=64)
    rp = RobustProblem(problem, np.array([[1e-4, 1e-4], [0.0, 0.0]]))
    weights, fraction = confident_step(rp, np.array([1.0, 0.0]), np.array([0.0, 1.0]), full_step_z=2.0)
    # Feasible from w1 = 1e-2 / 1.1e-2 on: the smallest feasible step.
    assert fraction == pytest.approx(1e-2 / 1.1e-2, abs=1e-6)
    assert rp.max_violation(weights) <= FEASIBILITY_TOL


@given(st.integers(0, 10_000), st.floats(0.5, 4.0))
@SETTINGS
def test_a_confident_step_is_feasible_whenever_the_answer_is(seed: int, z: float):
    rng = np.random.default_rng(seed)
    slopes = rng.normal(0.0, 1e-3, size=(3, 3))
    problem = MixtureProblem(
        slopes, np.array([2.0, 1.0, 1.5]), np.array([np.nan, 1.02, 1.51]), (0,), (1, 2), horizon=64
    )
    rp = RobustProblem(problem, np.abs(rng.normal(0.0, 3e-4, size=(3, 3))))
    previous, proposed = rng.dirichlet(np.ones(3)), rng.dirichlet(np.ones(3))
    weights, fraction = confident_step(rp, previous, proposed, z)
    assert 0.0 <= fraction <= 1.0
    np.testing.assert_allclose(weights, (1 - fraction) * previous + fraction * proposed, atol=1e-12)
    if rp.max_violation(proposed) <= FEASIBILITY_TOL:
        assert rp.max_violation(weights) <= FEASIBILITY_TOL
    else:
        assert fraction == 1.0  # nothing feasible: the least-violating answer, whole


# ------------------------------------------------------------- target share


def share_problem(reference: float) -> RobustProblem:
    # Dataset 0 is target data and harms the constraint; dataset 1 is neutral.
    slopes = np.array([[-1e-3, 0.0], [1e-3, 0.0]])
    problem = MixtureProblem(slopes, np.array([2.0, 1.0]), np.array([np.nan, reference]), (0,), (1,), horizon=100)
    return RobustProblem(problem, np.zeros((2, 2)))


def test_target_data_keeps_its_share_when_the_constraints_allow_it():
    weights, share = keep_target_share(share_problem(reference=2.0), np.array([0.0, 1.0]), [0], 0.2)
    np.testing.assert_allclose(weights, [0.2, 0.8])
    assert share.share == pytest.approx(0.2) and not share.limited_by_constraints


def test_target_share_stops_where_a_constraint_would_break():
    # 100 steps x 1e-3 x w0 <= 0.01: at most 0.1 of target data.
    rp = share_problem(reference=1.01)
    weights, share = keep_target_share(rp, np.array([0.0, 1.0]), [0], 0.2)
    assert share.limited_by_constraints
    assert weights[0] == pytest.approx(0.1, abs=1e-6)
    assert rp.max_violation(weights) <= FEASIBILITY_TOL


def test_target_share_leaves_a_mixture_that_must_recover_alone():
    rp = share_problem(reference=0.9)  # broken at theta_t: every step must go to recovery
    weights, share = keep_target_share(rp, np.array([0.0, 1.0]), [0], 0.2)
    np.testing.assert_array_equal(weights, [0.0, 1.0])
    assert share.limited_by_constraints and share.share == 0.0


def noisy_share_problem(reference: float, harm_error: float) -> RobustProblem:
    """:func:`share_problem` with a standard error on the target data's constraint slope."""
    rp = share_problem(reference)
    return RobustProblem(rp.problem, np.array([[0.0, 0.0], [harm_error, 0.0]]))


def test_in_the_fallback_the_share_is_kept_while_the_harm_is_within_noise():
    # Broken at theta_t (reference 0.9 < 1.0). Raising target data to 0.2 adds
    # 100 x 1e-3 x 0.2 = 0.02 to the predicted violation; one standard error of the
    # prediction at that mixture is 100 x 2e-3 x 0.2 = 0.04: within noise, so the share stays.
    rp = noisy_share_problem(reference=0.9, harm_error=2e-3)
    weights, share = keep_target_share(rp, np.array([0.0, 1.0]), [0], 0.2, in_fallback=True)
    np.testing.assert_allclose(weights, [0.2, 0.8])
    assert not share.limited_by_constraints and share.broken == (1,)
    assert share.to_dict()["broken_constraints"] == [1]


def test_in_the_fallback_a_harm_above_noise_leaves_the_budget_to_recovery():
    # The same harm with a standard error of 100 x 5e-4 x w0, half of it: any target data
    # makes the violation worse by more than noise.
    rp = noisy_share_problem(reference=0.9, harm_error=5e-4)
    weights, share = keep_target_share(rp, np.array([0.0, 1.0]), [0], 0.2, in_fallback=True)
    np.testing.assert_allclose(weights, [0.0, 1.0], atol=1e-7)  # up to FEASIBILITY_TOL's slack
    assert share.limited_by_constraints and share.broken == (1,)
    # Without in_fallback the mixture is left alone whatever the noise, and says why.
    untouched, share = keep_target_share(noisy_share_problem(0.9, 2e-3), np.array([0.0, 1.0]), [0], 0.2)
    np.testing.assert_array_equal(untouched, [0.0, 1.0])
    assert share.limited_by_constraints and share.broken == (1,)


def test_share_in_fallback_needs_a_target_share():
    with pytest.raises(ValueError, match=r"share_in_fallback.*target_share > 0"):
        RobustOptions(share_in_fallback=True)


def test_bad_option_values_are_refused_with_their_names():
    with pytest.raises(ValueError, match="target_share"):
        RobustOptions(target_share=1.0)
    with pytest.raises(ValueError, match="full_step_z"):
        RobustOptions(full_step_z=-1.0)
    with pytest.raises(ValueError, match="full_step_z"):
        confident_step(share_problem(2.0), np.array([1.0, 0.0]), np.array([0.0, 1.0]), full_step_z=0.0)


# ------------------------------------------------------------- the policy on a noisy toy

# Two datasets (d0, d1) that teach the target e0 equally well and a neutral d2; every
# dataset improves the constraint e1 by far more than the noise, so it never binds and
# only the target decision is within noise. (Where a constraint's slopes are within noise
# too, the constraint decides, and ``noise_margin`` is the option that speaks to it.)
NOISY_SLOPES = np.array([[-2e-3, -2e-3, 0.0], [-5e-3, -5e-3, -5e-3]])
NOISY_INITIAL = np.array([3.0, 2.0])


def noisy_run(options: RobustOptions, seed: int, noise: float = 0.02):
    learner = ToyLearner(NOISY_SLOPES, NOISY_INITIAL, seed=seed, noise=noise)
    policy = DynamicsPolicy(build_schedule([0, 8, 16, 32, 48, 64, 80, 96, 112], 128, probe_cap=8), options=options)
    return run_mixture_training(learner, policy, targets=[0], constraints=[1], eval_interval=32, reduced_batches=4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noise_flips_the_papers_mixture_between_vertices_and_confident_steps_do_not(seed: int):
    paper = noisy_run(RobustOptions(), seed)
    assert largest_move(paper) > 1.9  # a whole mixture moved from one vertex to another
    steady = noisy_run(RobustOptions(full_step_z=3.0), seed)
    assert largest_move(steady) < 1.0
    for update in steady.updates:
        assert 0.0 <= update.extra["robust"]["step_fraction"] <= 1.0


@pytest.mark.parametrize(
    ("stop", "used"),
    [
        # An even split of the two target datasets, which the pessimistic objective prefers
        # to any of the grid's answers: checked, and used although SLSQP reports no success.
        (np.array([0.5, 0.5, 0.0]), True),
        # No number at all: the point the solve started from instead.
        (np.full(3, np.nan), False),
    ],
)
def test_a_direct_solve_without_success_is_recorded_and_its_answer_used_only_when_checked(monkeypatch, stop, used):
    def failing(fun, x0, **kwargs):
        return OptimizeResult(x=stop.copy(), success=False, message="Positive directional derivative for linesearch")

    monkeypatch.setattr(robust_module, "minimize", failing)
    updates = noisy_run(RobustOptions(lp_candidate=True, target_noise=1.0), seed=0).updates
    for update in updates:
        assert update.extra["robust"]["solver_failure"] == "Positive directional derivative for linesearch"
    chosen = [update for update in updates if update.extra["robust"]["source"] == "direct"]
    assert chosen  # seed 0 makes the direct candidate win at least once
    for update in chosen:
        np.testing.assert_allclose(update.weights, update.extra["robust"]["weights"])
        assert np.allclose(update.weights, stop) == used
        assert np.all(update.weights >= 0) and update.weights.sum() == pytest.approx(1.0)


def test_target_data_keeps_weight_through_a_noisy_run():
    # The first dataset is named like the target domain: it is the target's own data.
    learner = ToyLearner(NOISY_SLOPES, NOISY_INITIAL, seed=0, noise=0.02, dataset_names=["e0", "d1", "d2"])
    policy = DynamicsPolicy(build_schedule([0, 8, 16, 32, 64], 128, probe_cap=8), options=RobustOptions(target_share=0.25))
    history = run_mixture_training(learner, policy, targets=[0], constraints=[1], eval_interval=32, reduced_batches=4)
    for update in history.updates:
        share = update.extra["robust"]["target_share"]
        assert share["wanted"] == 0.25
        assert update.weights[0] >= 0.25 - 1e-9 or share["limited_by_constraints"]
    assert any(not u.extra["robust"]["target_share"]["limited_by_constraints"] for u in history.updates)


# A constraint that sits at its reference and moves only by noise (like a quiz that a short
# probe cannot move): the target data d0 does not touch it, d1 nudges it down by less than
# the noise. At every update where the noise reads it above its reference no mixture is
# predicted to keep it, and the paper's fallback gives the whole budget to d1.
FLAT_SLOPES = np.array([[-2e-3, 0.0, 0.0], [0.0, -1e-4, 0.0]])
FLAT_INITIAL = np.array([3.0, 2.0])


def flat_run(options: RobustOptions, seed: int):
    learner = ToyLearner(FLAT_SLOPES, FLAT_INITIAL, seed=seed, noise=0.02, dataset_names=["e0", "d1", "d2"])
    policy = DynamicsPolicy(build_schedule([0, 8, 16, 32, 48, 64, 80, 96, 112], 128, probe_cap=8), options=options)
    history = run_mixture_training(learner, policy, targets=[0], constraints=[1], eval_interval=32, reduced_batches=4)
    return history, learner.values()  # the true values at the end, without evaluation noise


@pytest.mark.parametrize("seed", [1, 2])  # seeds whose noise breaks the constraint at an update
def test_target_data_keeps_its_share_when_a_constraint_is_broken_by_noise(seed: int):
    plain, plain_end = flat_run(RobustOptions(target_share=0.2), seed)
    starved = [u for u in plain.updates if u.weights[0] < 0.2 - 1e-9]
    assert starved  # the case happens: a fallback took the targets' data away
    assert all(u.extra["robust"]["target_share"]["broken_constraints"] == [1] for u in starved)
    kept, kept_end = flat_run(RobustOptions(target_share=0.2, share_in_fallback=True), seed)
    fallbacks = [u for u in kept.updates if "broken_constraints" in u.extra["robust"]["target_share"]]
    assert fallbacks  # the case happens here too
    assert all(u.weights[0] >= 0.2 - 1e-9 for u in fallbacks)
    # Where some mixture was predicted feasible, the share still stops where it would break
    # a predicted constraint, as without the option.
    assert all(u.weights[0] >= 0.2 - 1e-9 or u.extra["robust"]["target_share"]["limited_by_constraints"]
               for u in kept.updates)
    # More target data, a lower target loss, and the constraint's true value still at or
    # below its reference (the target data does not touch it).
    assert kept_end[0] < plain_end[0]
    assert kept_end[1] <= FLAT_INITIAL[1]


# ------------------------------------------------------------- perturbed evaluations


def test_perturbed_evaluations_multiply_each_value_by_a_seeded_draw():
    learner = ToyLearner(NOISY_SLOPES, NOISY_INITIAL)
    plain = learner.evaluate("eval").per_batch
    first = PerturbedEvaluations(ToyLearner(NOISY_SLOPES, NOISY_INITIAL), 1e-3, seed=5).evaluate("eval").per_batch
    again = PerturbedEvaluations(ToyLearner(NOISY_SLOPES, NOISY_INITIAL), 1e-3, seed=5).evaluate("eval").per_batch
    np.testing.assert_array_equal(first, again)
    ratio = first / plain - 1.0
    assert 0 < np.abs(ratio).max() < 5e-3 and not np.allclose(ratio, ratio.flat[0])
    with pytest.raises(ValueError, match="relative"):
        PerturbedEvaluations(learner, 0.0)


def test_a_run_under_perturbed_evaluations_trains_the_wrapped_learner():
    learner = ToyLearner(NOISY_SLOPES, NOISY_INITIAL)
    policy = DynamicsPolicy(build_schedule([0, 16], 32, probe_cap=4))
    history = run_mixture_training(
        PerturbedEvaluations(learner, 1e-6), policy, targets=[0], constraints=[1], eval_interval=16, reduced_batches=4
    )
    assert learner.trained_steps == 32
    assert history.dataset_names == learner.dataset_names


class ProbesItself(ToyLearner):
    """A toy that runs every probe of an update itself, as the engine's learner does."""

    def probe_all(self, checkpoints, num_batches):
        snapshot = self.snapshot()
        evaluations, expected, seconds = probe_in_turn(self, range(len(self.dataset_names)), checkpoints, num_batches, snapshot)
        self.restore(snapshot)
        return ProbeRuns(evaluations, seconds, [[0]] * len(seconds), expected)


@pytest.mark.parametrize("learner_type", [ToyLearner, ProbesItself])
def test_probe_evaluations_are_perturbed_too(learner_type):
    plain = probe_datasets(learner_type(NOISY_SLOPES, NOISY_INITIAL), [4], 4).evaluations
    wrapped = PerturbedEvaluations(learner_type(NOISY_SLOPES, NOISY_INITIAL), 1e-3)
    perturbed = probe_datasets(wrapped, [4], 4).evaluations
    assert perturbed.shape == plain.shape
    assert 0 < np.abs(perturbed / plain - 1).max() < 5e-3
    assert wrapped.learner.trained_steps == 0  # back where it started


# ------------------------------------------------------------- ties at an evaluation's resolution

# A constraint like a quiz that no short probe moves: datasets 0 and 1 leave it exactly
# where it is, dataset 2 costs it a question (0.02) per 16 steps. Without dataset 2 it sits
# exactly at its reference all run, so every decision is made at a tie, which evaluations
# perturbed by one part in a million (two machines) break one way or the other.
TIED_SLOPES = np.array([[-3e-3, -2e-3, -4e-3], [0.0, 0.0, 1.25e-3]])


def tied(steps: np.ndarray) -> np.ndarray:
    values = TIED_SLOPES @ steps
    values[1] = 0.02 * np.floor(values[1] / 0.02 + 0.5)
    return values


def tied_run(relative_noise: float, noise_seed: int = 0):
    learner = ToyLearner(TIED_SLOPES, NOISY_INITIAL, effect=tied)
    run_on = PerturbedEvaluations(learner, relative_noise, noise_seed) if relative_noise > 0 else learner
    policy = DynamicsPolicy(build_schedule([0, 1, 2, 4, 8, 16, 32, 64], 128, probe_cap=16), options=VARIANTS["robust"])
    return run_mixture_training(run_on, policy, targets=[0], constraints=[1], eval_interval=32, reduced_batches=4)


def largest_difference(a, b) -> float:
    """The largest L1 distance between the two runs' mixtures at the same update."""
    return max(float(np.abs(x.weights - y.weights).sum()) for x, y in zip(a.updates, b.updates, strict=True))


def test_differences_below_the_resolution_are_read_as_none():
    problem = MixtureProblem(
        slopes=np.array([[-1e-3, -2e-3], [3e-7, 1e-3], [-1 / 48 / 16 + 1e-9, 2 / 48 / 16]]),
        current_losses=np.array([3.0, 2.0 + 4e-6, -0.75 + 1 / 48 - 2e-7]),
        reference_losses=np.array([np.nan, 2.0, -0.75]),
        targets=(0,),
        constraints=(1, 2),
        horizon=64,
    )
    # Domain 2 is an accuracy over 48 questions: its changes are whole answers.
    resolved = at_resolution(problem, probe_budget=16, questions=[0, 0, 48])
    np.testing.assert_array_equal(resolved.slopes[:2], [[-1e-3, -2e-3], [0.0, 1e-3]])  # 16 * 3e-7 < 1e-5
    np.testing.assert_allclose(resolved.slopes[2], [-1 / 48 / 16, 2 / 48 / 16], rtol=0, atol=1e-17)
    np.testing.assert_array_equal(resolved.current_losses[:2], [3.0, 2.0])
    assert resolved.current_losses[2] == -0.75 + 1 / 48
    far = replace(problem, current_losses=np.array([3.0, 2.0 + 1e-4, -0.75 + 0.01]), slopes=problem.slopes * 100)
    np.testing.assert_array_equal(at_resolution(far, 16, [0, 0, 48]).current_losses, far.current_losses)
    np.testing.assert_array_equal(at_resolution(far, 16, [0, 0, 48]).slopes[:2], far.slopes[:2])
    with pytest.raises(ValueError, match="questions"):
        at_resolution(problem, 16, [0, 48])


def fallback_choice(perturbation: np.ndarray, resolve: bool) -> np.ndarray:
    # An accuracy over 48 questions broken by two answers; datasets 0 and 1 each won one
    # back in their 8-step probe, and the 8-step horizon wins back one more at most, so no
    # mixture is feasible and both tie on the violation. The tie goes to the target's data.
    problem = MixtureProblem(
        slopes=np.array([[-3e-3, -1e-3, 0.0], [-1 / 48 / 8, -1 / 48 / 8, 0.0]]) * (1 + perturbation),
        current_losses=np.array([3.0, -0.75 + 2 / 48]) * (1 + 1e-6 * perturbation[:, 2]),
        reference_losses=np.array([np.nan, -0.75]),
        targets=(0,),
        constraints=(1,),
        horizon=8,
    )
    if resolve:
        problem = at_resolution(problem, probe_budget=8, questions=[0, 48])
    rp = RobustProblem(problem, np.full((2, 3), 1e-4), target_z=1.0, gain_exponent=0.5, probe_budget=8)
    return select_robust(rp, [c.weights for c in grid_candidates(problem)], solve_direct(rp)).weights


def test_two_datasets_that_won_back_the_same_answers_tie_in_the_fallback():
    rng = np.random.default_rng(0)
    draws = [1e-6 * rng.standard_normal((2, 3)) for _ in range(8)]
    np.testing.assert_allclose(fallback_choice(np.zeros((2, 3)), resolve=True), [1.0, 0.0, 0.0], atol=1e-6)
    for draw in draws:
        np.testing.assert_allclose(fallback_choice(draw, resolve=True), [1.0, 0.0, 0.0], atol=1e-6)
    # Read exactly, the hair decides: dataset 1 wins whenever its slope draws the larger gain.
    assert any(fallback_choice(draw, resolve=False)[1] > 0.5 for draw in draws)


@pytest.mark.parametrize("noise_seed", [0, 1, 2, 3])
def test_a_tie_at_the_reference_is_decided_alike_on_two_machines(noise_seed: int):
    plain = tied_run(0.0)
    assert {u.current_losses[1] for u in plain.updates} == {plain.updates[0].current_losses[1]}  # at a tie
    assert largest_difference(plain, tied_run(1e-6, noise_seed)) < 1e-3


def test_read_exactly_the_same_tie_flips_decisions(monkeypatch):
    monkeypatch.setattr(policies_module, "at_resolution", lambda problem, probe_budget, questions: problem)
    plain = tied_run(0.0)
    assert max(largest_difference(plain, tied_run(1e-6, seed)) for seed in range(4)) > 0.5


# ------------------------------------------------------------- the fallback on non-target data


def fallback_problem(advantage: float, error: float, reference: float) -> RobustProblem:
    # The constraint e1 is broken at theta_t (1.0 against ``reference``). Dataset 0 is target
    # data and repairs it faster than the non-target dataset 1 by ``advantage`` per step,
    # measured with standard error ``error`` on each constraint slope.
    slopes = np.array([[-1e-3, 0.0], [-1e-4 - advantage, -1e-4]])
    problem = MixtureProblem(slopes, np.array([2.0, 1.0]), np.array([np.nan, reference]), (0,), (1,), horizon=100)
    return RobustProblem(problem, np.array([[0.0, 0.0], [error, error]]))


def test_a_fallback_bet_on_target_data_within_noise_goes_to_the_non_target_data():
    # The least-violating mixture is all target data, 0.001 below the non-target answer's
    # violation of 0.09 over the horizon; one standard error of that difference is
    # 100 x 1e-4 x sqrt(2) = 0.014: within noise.
    rp = fallback_problem(advantage=1e-5, error=1e-4, reference=0.9)
    answer = solve_direct(rp).weights
    np.testing.assert_allclose(answer, [1.0, 0.0], atol=1e-9)
    weights, record = general_fallback(rp, answer, [0], z=1.0)
    np.testing.assert_allclose(weights, [0.0, 1.0], atol=1e-9)
    assert not record["kept_targets"]
    assert record["violation"] == pytest.approx(0.089) and record["general_violation"] == pytest.approx(0.09)
    # The same bet with no noise on it is taken.
    kept, record = general_fallback(fallback_problem(advantage=1e-5, error=0.0, reference=0.9), answer, [0], z=1.0)
    np.testing.assert_array_equal(kept, answer)
    assert record["kept_targets"]


def test_a_fallback_bet_on_target_data_above_noise_is_kept():
    # Target data repairs 0.11 over the horizon, the non-target data 0.01; 0.1 is seven
    # standard errors.
    rp = fallback_problem(advantage=1e-3, error=1e-4, reference=0.5)
    answer = solve_direct(rp).weights
    weights, record = general_fallback(rp, answer, [0], z=1.0)
    np.testing.assert_array_equal(weights, answer)
    assert record["kept_targets"] and record["pessimistic_violation"] < record["general_violation"]


def test_the_general_fallback_leaves_feasible_and_target_free_answers_alone():
    feasible = fallback_problem(advantage=1e-3, error=1e-4, reference=1.0)  # not broken at theta_t
    answer = solve_direct(feasible).weights
    assert feasible.max_violation(answer) <= FEASIBILITY_TOL
    assert general_fallback(feasible, answer, [0], z=1.0) == (answer, None)
    broken = fallback_problem(advantage=1e-5, error=1e-4, reference=0.9)
    target_free = np.array([0.0, 1.0])
    assert general_fallback(broken, target_free, [0], z=1.0)[1] is None
    assert general_fallback(broken, np.array([1.0, 0.0]), [], z=1.0)[1] is None  # no target data


def test_the_general_fallback_refuses_a_least_weight_on_target_data():
    rp = replace(fallback_problem(advantage=1e-5, error=1e-4, reference=0.9), least_weights=np.array([0.1, 0.0]))
    with pytest.raises(ValueError, match=r"general_fallback.*least weight"):
        general_fallback(rp, np.array([0.9, 0.1]), [0], z=1.0)
    with pytest.raises(ValueError, match=r"general_fallback.*target_floor"):
        RobustOptions(general_fallback=1.0, target_floor=0.02)
    with pytest.raises(ValueError, match="general_fallback"):
        RobustOptions(general_fallback=-1.0)


# Nothing is feasible: every dataset harms the constraint e1, the target data d0 ("e0", it
# also teaches the target) four times as much as d1. Short probes (one step at the dense
# warmup's first updates) measure these slopes with an error of about 0.014 per step, ten
# times their difference, so the fallback's least-violating answer is a coin toss between
# the two datasets until the probes grow.
HARM_SLOPES = np.array([[-2e-3, 0.0], [2e-3, 5e-4]])
HARM_INITIAL = np.array([3.0, 2.0])


def harm_run(options: RobustOptions, seed: int):
    learner = ToyLearner(HARM_SLOPES, HARM_INITIAL, seed=seed, noise=0.02, dataset_names=["e0", "d1"])
    policy = DynamicsPolicy(build_schedule([0, 1, 2, 4, 8, 16, 32, 64], 128, probe_cap=16), options=options)
    history = run_mixture_training(learner, policy, targets=[0], constraints=[1], eval_interval=32, reduced_batches=4)
    return history, learner.values()


@pytest.mark.parametrize("seed", [0, 1])  # seeds whose noise makes a fallback bet on target data
def test_where_nothing_is_feasible_noise_does_not_bet_the_mixture_on_target_data(seed: int):
    plain, plain_end = harm_run(ROBUST_ALONE, seed)
    guarded, guarded_end = harm_run(replace(ROBUST_ALONE, general_fallback=1.0), seed)
    bets = [
        u for u in guarded.updates
        if u.extra["robust"]["general_fallback"] is not None and u.extra["robust"]["weights"][0] > 0.5
    ]
    assert bets  # the case happens: a fallback's answer put most of the mixture on target data
    for update in bets:
        assert not update.extra["robust"]["general_fallback"]["kept_targets"]
        assert update.weights[0] == 0.0
    # Less of the harmful data trained, so the constraint's true value ends lower.
    assert guarded.updates[-1].step == plain.updates[-1].step
    assert guarded_end[1] < plain_end[1]


@pytest.mark.parametrize("seed", range(6))  # on each, the noise makes a warmup update bet on target data
def test_the_warmup_holds_target_data_at_its_floor_and_trains_room_for_the_constraints(seed: int):
    plain, plain_end = harm_run(VARIANTS["robust"], seed)
    warmup = [u.step for u in plain.updates if u.probe_budget < 16]
    assert warmup == [0, 1, 2, 4, 8]
    assert any(u.weights[0] > 0.5 for u in plain.updates if u.step in warmup)  # the case happens
    roomy, roomy_end = harm_run(replace(VARIANTS["robust"], warmup_room=True), seed)
    for update in roomy.updates:
        if update.step in warmup:
            # The target dataset at the robust variant's 2% floor, the rest on d1, which
            # harms the constraint a quarter as much; the record keeps the solver's answer.
            np.testing.assert_allclose(update.weights, [0.02, 0.98])
            assert len(update.extra["robust"]["warmup_answer"]) == 2
        else:
            assert "warmup_answer" not in update.extra["robust"]
    # Less of the harmful data trained, so the constraint's true value ends lower.
    assert roomy_end[1] < plain_end[1]


def test_the_warmup_fallback_keeps_the_bets_predicted_safe_and_moves_only_the_fallbacks():
    # Seed 1: the default's warmup update at step 1 predicts no mixture feasible and its
    # fallback puts everything on the target dataset.
    plain, plain_end = harm_run(VARIANTS["robust"], seed=1)
    moved, moved_end = harm_run(replace(VARIANTS["robust"], warmup_fallback=True), seed=1)
    step_1 = next(u for u in plain.updates if u.step == 1)
    assert not step_1.extra["robust"]["feasible"] and step_1.weights[0] == pytest.approx(1.0)
    fallbacks = 0
    for update in moved.updates:
        robust = update.extra["robust"]
        if update.probe_budget < 16 and not robust["feasible"]:
            fallbacks += 1
            np.testing.assert_allclose(update.weights, [0.02, 0.98])
            assert len(robust["warmup_answer"]) == 2
        else:
            # Predicted to keep the constraint, or past the warmup: the solver's answer stands.
            assert "warmup_answer" not in robust
            np.testing.assert_allclose(update.weights, robust["weights"])
    assert fallbacks >= 1
    # The run's first update is the same; the constraint's true value ends lower.
    np.testing.assert_allclose(moved.updates[0].weights, plain.updates[0].weights)
    assert moved_end[1] < plain_end[1]
    with pytest.raises(ValueError, match="warmup_fallback"):
        replace(VARIANTS["robust"], warmup_room=True, warmup_fallback=True)


def test_warmup_room_is_the_most_room_left_with_the_targets_held():
    # d0 is target data held at 0.1, harming both constraints a little; d1 harms the first
    # constraint and helps the second, d2 the other way round; both start at their references.
    problem = MixtureProblem(
        slopes=np.array([[-4e-3, 0.0, 0.0], [1e-4, 2e-3, -3e-3], [1e-4, -3e-3, 2e-3]]),
        current_losses=np.array([3.0, 2.0, 1.5]),
        reference_losses=np.array([np.nan, 2.0, 1.5]),
        targets=(0,),
        constraints=(1, 2),
        horizon=8,
    )
    rp = RobustProblem(problem, np.zeros((3, 3)), least_weights=np.array([0.1, 0.0, 0.0]))
    answer = np.array([0.9, 0.1, 0.0])
    weights, replaced = warmup_room(rp, answer, [0])
    assert replaced == [0.9, 0.1, 0.0]
    assert weights[0] == pytest.approx(0.1) and weights.sum() == pytest.approx(1.0)
    # No other split of the remaining 0.9 leaves more room: the largest predicted change past
    # a reference (negative where every constraint has room) is the smallest.
    def largest_change(w: np.ndarray) -> float:
        return float(np.max(problem.predicted_losses(w)[[1, 2]] - problem.reference_losses[[1, 2]]))

    assert largest_change(weights) < 0  # d1 and d2 in the right proportion help both constraints
    for share in np.linspace(0.0, 0.9, 91):
        assert largest_change(weights) <= largest_change(np.array([0.1, share, 0.9 - share])) + 1e-12
    # Nothing to make room for, or no data but the targets': the solver's answer stands.
    unconstrained = replace(problem, constraints=(), reference_losses=np.array([np.nan, np.nan, np.nan]))
    for rp_, targets in ((RobustProblem(unconstrained, np.zeros((3, 3))), [0]), (rp, [0, 1, 2])):
        kept, replaced = warmup_room(rp_, answer, targets)
        assert replaced is None and kept is answer


def test_warmup_room_changes_nothing_without_a_constraint():
    def run(options: RobustOptions):
        learner = ToyLearner(NOISY_SLOPES, NOISY_INITIAL, seed=0, noise=0.02, dataset_names=["e0", "d1", "d2"])
        policy = DynamicsPolicy(build_schedule([0, 1, 2, 4, 8, 16, 32, 64], 128, probe_cap=16), options=options)
        return run_mixture_training(learner, policy, targets=[0], constraints=[], eval_interval=32, reduced_batches=4)

    plain, roomy = run(VARIANTS["robust"]), run(replace(VARIANTS["robust"], warmup_room=True))
    assert len(plain.updates) == len(roomy.updates) == 8
    for a, b in zip(plain.updates, roomy.updates, strict=True):
        np.testing.assert_array_equal(a.weights, b.weights)
        # The warmup's updates record that no answer was replaced; the others say nothing.
        assert b.extra["robust"].get("warmup_answer", "absent") == (None if b.probe_budget < 16 else "absent")


# ------------------------------------------------------------- expected accuracy

# The quantized constraint above as an accuracy of 50 questions (-0.7: 35 right), whose
# expected accuracy (the probability of the correct answers, before they flip) is the
# value before rounding, measured as precisely as a real evaluation's fixed batches do.
ACCURACY_INITIAL = np.array([3.0, -0.7])


class ExpectedAccuracyLearner(ToyLearner):
    """The quantized toy reporting its constraint's expected accuracy too."""

    def __init__(self, seed: int) -> None:
        super().__init__(
            QUANTIZED_SLOPES, ACCURACY_INITIAL, seed=seed, noise=2e-4, effect=quantized,
            kinds=[DomainKind("loss", 4), DomainKind("accuracy", 50)],
        )
        for offsets in self.offsets.values():
            offsets[1] *= 0.05  # per-batch accuracies within [-1, 0]

    def unrounded(self) -> np.ndarray:
        return self.initial + QUANTIZED_SLOPES @ self.steps_per_dataset

    def evaluate(self, split, num_batches=None):
        evaluation = super().evaluate(split, num_batches)
        residue = self.unrounded() - self.values()
        return Evaluation(evaluation.per_batch, evaluation.per_batch + residue[:, None])


def expected_accuracy_run(options: RobustOptions, seed: int):
    learner = ExpectedAccuracyLearner(seed)
    schedule = build_schedule([0, 8, 16, 32, 64, 96, 128, 160, 192, 224], 256, probe_cap=4)
    history = run_mixture_training(
        learner, DynamicsPolicy(schedule, options=options), targets=[0], constraints=[1], eval_interval=32,
        reduced_batches=4,
    )
    return history, learner.values() - ACCURACY_INITIAL


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_an_accuracy_read_from_its_expected_value_shows_a_harm_before_any_answer_flips(seed: int):
    # A 4-step probe of dataset 0 flips no answer, so its measured accuracy slope is 0 and
    # the robust variant reading it trains dataset 0 until answers are lost; the expected
    # accuracy (the robust variant's default) moves by 4e-4 a step from the first probe on,
    # and the run moves to dataset 1, which teaches the target almost as well and costs the
    # accuracy nothing.
    options = ROBUST_ALONE
    assert options.expected_accuracy
    measured, measured_end = expected_accuracy_run(replace(options, expected_accuracy=False), seed)
    expected, expected_end = expected_accuracy_run(options, seed)
    assert measured_end[1] >= 0.02 - 1e-9  # the case happens: at least one answer lost
    assert expected_end[1] <= 1e-9  # no answer lost
    assert expected_end[0] <= measured_end[0] + 0.01  # and the target learned about as much
    assert all(u.extra["accuracy_slopes"] == "expected" for u in expected.updates)
    assert all("accuracy_slopes" not in u.extra for u in measured.updates)


# A quiz of 48 questions (4 batches of 12) whose correct choices every dataset makes a
# little less likely, by far too little to flip an answer in the whole run: dataset 0
# teaches the target three times as fast and costs twice the probability of dataset 1.
DRIFT_SLOPES = np.array([[-3e-3, -1e-3], [2e-5, 1e-5]])


def unflipped(steps: np.ndarray) -> np.ndarray:
    values = DRIFT_SLOPES @ steps
    values[1] = np.round(values[1] * 48) / 48  # whole answers: none flips
    return values


class DriftLearner(ToyLearner):
    """Answers that stay put while their probability drifts; evaluations noisy by 2e-6."""

    def __init__(self, seed: int) -> None:
        super().__init__(
            DRIFT_SLOPES, np.array([3.0, -0.5]), num_batches=4, seed=seed, noise=2e-6, effect=unflipped,
            kinds=[DomainKind("loss", 4), DomainKind("accuracy", 12)],
        )
        for offsets in self.offsets.values():
            offsets[1] = 0.0  # every batch at the quiz's mean

    def evaluate(self, split, num_batches=None):
        evaluation = super().evaluate(split, num_batches)
        residue = self.initial + DRIFT_SLOPES @ self.steps_per_dataset - self.values()
        return Evaluation(evaluation.per_batch, evaluation.per_batch + residue[:, None])


def drift_run(answer_tolerance: float, seed: int):
    learner = DriftLearner(seed)
    schedule = build_schedule([0, 8, 16, 32, 64, 96, 128, 160, 192, 224], 256, probe_cap=4)
    options = replace(ROBUST_ALONE, answer_tolerance=answer_tolerance)
    history = run_mixture_training(
        learner, DynamicsPolicy(schedule, options=options), targets=[0], constraints=[1], eval_interval=32,
        reduced_batches=4,
    )
    return history, learner.values() - learner.initial


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_drift_of_the_correct_choices_too_small_to_flip_an_answer_does_not_break_every_mixture(seed: int):
    # With the quiz at its reference every dataset is predicted to break it by a sliver of
    # an answer, so without a tolerance every update falls back to the least-violating
    # mixture, dataset 1 alone; half an answer of tolerance reads the sliver as no answer
    # lost, and the target's data is trained. No answer flips in either run.
    strict, strict_end = drift_run(0.0, seed)
    tolerant, tolerant_end = drift_run(0.5, seed)
    assert sum(not u.extra["robust"]["feasible"] for u in strict.updates) >= len(strict.updates) - 1  # the case
    assert all(u.extra["robust"]["feasible"] for u in tolerant.updates)
    assert strict_end[1] == tolerant_end[1] == 0.0  # the quiz kept every answer
    assert tolerant_end[0] < strict_end[0] - 0.2  # the target learned far more
    assert np.mean([u.weights[0] for u in tolerant.updates]) > 0.8


def test_an_answer_tolerance_needs_expected_accuracies_and_less_than_one_answer():
    with pytest.raises(ValueError, match="set expected_accuracy: true"):
        RobustOptions(expected_accuracy=False, answer_tolerance=0.5)
    with pytest.raises(ValueError, match=r"answer_tolerance must be in \[0, 1\)"):
        replace(VARIANTS["robust"], answer_tolerance=1.0)
    problem = MixtureProblem(
        slopes=np.zeros((3, 2)),
        current_losses=np.array([3.0, 2.0, -0.5]),
        reference_losses=np.array([np.nan, 2.0, -0.5]),
        targets=(0,),
        constraints=(1, 2),
        horizon=8,
    )
    widened = with_answer_tolerance(problem, [0, 0, 48], 0.5)
    np.testing.assert_array_equal(widened.reference_losses[1:], [2.0, -0.5 + 0.5 / 48])  # losses untouched


def accuracy_updates(learner: ToyLearner, expected_accuracy: bool):
    options = replace(ROBUST_ALONE, expected_accuracy=expected_accuracy)
    policy = DynamicsPolicy(build_schedule([0, 4], 8, probe_cap=4), options=options)
    return run_mixture_training(learner, policy, targets=[0], constraints=[1], eval_interval=8, reduced_batches=4).updates


def test_without_expected_accuracies_the_measured_ones_decide_and_the_record_says_so():
    # A learner whose evaluations report no expected accuracy: the option reads the
    # measured accuracy, as without it, and every update says so.
    def measured_only() -> ToyLearner:
        learner = ToyLearner(QUANTIZED_SLOPES, ACCURACY_INITIAL, kinds=[DomainKind("loss", 4), DomainKind("accuracy", 50)])
        for offsets in learner.offsets.values():
            offsets[1] *= 0.05  # per-batch accuracies within [-1, 0]
        return learner

    read, plain = (accuracy_updates(measured_only(), on) for on in (True, False))
    assert [u.weights.tolist() for u in read] == [u.weights.tolist() for u in plain]
    assert all(u.extra["accuracy_slopes"].startswith("measured: the learner reports no expected") for u in read)
    # Without an accuracy domain there is nothing to read: the same decisions, no record.
    loss_only = [accuracy_updates(ToyLearner(QUANTIZED_SLOPES, np.array([3.0, 2.0])), on) for on in (True, False)]
    assert [u.weights.tolist() for u in loss_only[0]] == [u.weights.tolist() for u in loss_only[1]]
    assert all("accuracy_slopes" not in u.extra for u in loss_only[0])

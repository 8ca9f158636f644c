"""The target floor (``method.floors.targets``, the ``target_floor`` rule): every target
dataset keeps a least weight at every update, inside the solver and in its fallback, and the
floor gives way where it alone stands between the mixture and the constraints.

The toy learner's noise is known, so each test says which breaks are noise and which are
the target data's."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from dynamics.core.controller import run_mixture_training
from dynamics.core.decisions import target_floor
from dynamics.core.policies import DynamicsPolicy
from dynamics.core.problem import FEASIBILITY_TOL, MixtureProblem, to_floored_simplex
from dynamics.core.robust import RobustProblem, select_robust, solve_direct
from dynamics.core.rules import RuleSet, rule_set
from dynamics.core.rules.target_floor import TargetFloorRecord
from dynamics.core.schedules import build_schedule
from dynamics.core.solver import grid_candidates
from dynamics.engine.method_config import MethodConfig
from tests.core.toy_learner import ToyLearner


def floor_problem(reference: float, harm: float, repair: float) -> RobustProblem:
    """Dataset 0 is the target's own data and moves the constraint by ``harm`` per step;
    dataset 1 moves it by ``repair``; the constraint stands at 1.0 against ``reference``."""
    slopes = np.array([[-1e-2, 0.0], [harm, repair]])
    problem = MixtureProblem(
        slopes, np.array([3.0, 1.0]), np.array([np.nan, reference]), (0,), (1,), horizon=100
    )
    return RobustProblem(problem, np.zeros((2, 2)))


def test_the_floor_holds_where_a_floored_mixture_keeps_every_constraint():
    rp = floor_problem(reference=1.0, harm=1e-4, repair=-1e-4)  # at most half target data
    floored, record = target_floor(rp, [0], 0.2)
    np.testing.assert_array_equal(floored.least_weights, [0.2, 0.0])
    assert record == {"floor": 0.2, "target_datasets": [0], "lifted_by": []}
    assert solve_direct(floored).weights[0] == pytest.approx(0.5)


def test_the_floor_gives_way_where_it_alone_breaks_a_constraint():
    # The constraint is 0.01 above its reference; 100 steps of dataset 1 repair 0.02, and
    # each 0.1 of target data costs 0.005 + 0.002 of that: at most 1/7 of target data
    # recovers in time, so no mixture with 0.2 does.
    rp = floor_problem(reference=0.99, harm=5e-4, repair=-2e-4)
    lifted, record = target_floor(rp, [0], 0.2)
    assert lifted.least_weights is None
    assert record["lifted_by"] == [1]
    assert solve_direct(lifted).feasible


def test_the_floor_holds_where_no_mixture_keeps_the_constraints_either_way():
    # A constraint below its reference that no dataset moves in time (a quiz one answer
    # down): the fallback without the floor would give the target data nothing.
    rp = floor_problem(reference=0.99, harm=0.0, repair=-1e-6)
    floored, record = target_floor(rp, [0], 0.2)
    np.testing.assert_array_equal(floored.least_weights, [0.2, 0.0])
    assert record["no_mixture_feasible"] and record["lifted_by"] == []
    assert solve_direct(rp).weights[0] == pytest.approx(0.0, abs=1e-4)
    assert solve_direct(floored).weights[0] == pytest.approx(0.2, abs=1e-4)


def test_bad_floors_are_refused_with_the_field_to_change():
    with pytest.raises(ValueError, match=r"method.floors.targets below 0.5"):
        target_floor(floor_problem(1.0, 0.0, 0.0), [0, 1], 0.5)
    with pytest.raises(ValueError, match=r"method\.floors\.targets must be in \[0, 1\)"):
        rule_set(target_floor=1.0)
    with pytest.raises(ValidationError, match=r"floors\.targets"):
        MethodConfig(floors={"targets": -0.1})
    assert MethodConfig(floors={"targets": 0.05}).target_floor == 0.05


def test_a_floor_of_zero_leaves_the_problem_as_it_is():
    slopes = np.array([[-1e-2, 0.0, 0.0]])
    rp = RobustProblem(
        MixtureProblem(slopes, np.array([3.0]), np.array([np.nan]), (0,), (), horizon=100),
        np.zeros((1, 3)),
    )
    unchanged, record = target_floor(rp, [0], 0.0)
    assert unchanged is rp and unchanged.least_weights is None
    assert record == {"floor": 0.0, "target_datasets": [0], "lifted_by": []}


# ------------------------------------------------------------- inside the solver


@pytest.mark.parametrize("seed", range(5))
def test_a_mixture_with_one_floor_per_weight_keeps_each_floor_and_sums_to_one(seed: int):
    rng = np.random.default_rng(seed)
    floors = np.array([0.2, 0.0, 0.1, 0.0])
    w = to_floored_simplex(rng.normal(0.3, 0.5, size=4), floors)
    assert np.all(w >= floors - 1e-15) and w.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(to_floored_simplex(w, floors), w)  # already a floored mixture
    np.testing.assert_array_equal(to_floored_simplex(w, np.zeros(4)), to_floored_simplex(w, 0.0))


def broken_problem() -> MixtureProblem:
    """The constraint is already above its reference: target data (dataset 0) harms it a
    little, dataset 1 repairs it, so no mixture is predicted to keep it."""
    slopes = np.array([[-1e-2, 0.0], [1e-4, -1e-5]])
    return MixtureProblem(
        slopes, np.array([3.0, 1.1]), np.array([np.nan, 1.0]), (0,), (1,), horizon=100
    )


def test_in_the_fallback_the_floor_keeps_target_data_and_the_rest_repairs_the_constraint():
    problem = broken_problem()
    plain = solve_direct(RobustProblem(problem, np.zeros((2, 2))))
    assert not plain.feasible
    # The fallback may spend half of FEASIBILITY_TOL of violation on the target: ~5e-8 here.
    np.testing.assert_allclose(plain.weights, [0.0, 1.0], atol=1e-6)
    floored_rp = RobustProblem(problem, np.zeros((2, 2)), least_weights=np.array([0.2, 0.0]))
    floored = solve_direct(floored_rp)
    assert not floored.feasible
    np.testing.assert_allclose(floored.weights, [0.2, 0.8], atol=1e-6)
    # The grid's candidates are raised to the floor before the choice.
    choice = select_robust(
        floored_rp, [c.weights for c in grid_candidates(problem)], [floored.candidate()]
    )
    assert choice.weights[0] >= 0.2 - 1e-12
    assert choice.weights.sum() == pytest.approx(1.0)


def test_where_a_mixture_is_feasible_the_floor_only_bounds_the_optimum():
    slopes = np.array([[-1e-2, -2e-2], [1e-3, -1e-3]])
    problem = MixtureProblem(
        slopes, np.array([3.0, 1.0]), np.array([np.nan, 1.0]), (0,), (1,), horizon=100
    )
    rp = RobustProblem(problem, np.zeros((2, 2)), least_weights=np.array([0.3, 0.0]))
    direct = solve_direct(rp)
    assert direct.feasible and rp.max_violation(direct.weights) <= FEASIBILITY_TOL
    np.testing.assert_allclose(
        direct.weights, [0.3, 0.7], atol=1e-9
    )  # dataset 1 teaches the target faster


# ------------------------------------------------------------- the policy on a noisy toy

# A constraint that sits at its reference and moves only by noise (like a quiz that a
# short probe cannot move). d0 is the target's own data and does not touch it; d1 nudges
# it down by less than the noise.
FLAT_SLOPES = np.array([[-2e-3, 0.0, 0.0], [0.0, -1e-4, 0.0]])
FLAT_INITIAL = np.array([3.0, 2.0])
SCHEDULE = [0, 8, 16, 32, 48, 64, 80, 96, 112]


def toy_run(slopes: np.ndarray, options: RuleSet, seed: int, noise: float):
    learner = ToyLearner(
        slopes, FLAT_INITIAL, seed=seed, noise=noise, dataset_names=["e0", "d1", "d2"]
    )
    policy = DynamicsPolicy(build_schedule(SCHEDULE, 128, probe_cap=8), rules=options)
    history = run_mixture_training(
        learner, policy, targets=[0], constraints=[1], eval_interval=32, reduced_batches=4
    )
    return history, learner.values()  # the true values at the end, without evaluation noise


@pytest.mark.parametrize(
    "seed", [1, 2]
)  # seeds whose noise reads the constraint broken at an update
def test_target_data_keeps_its_floor_where_a_constraint_is_broken_by_noise(seed: int):
    plain, plain_end = toy_run(FLAT_SLOPES, rule_set(lp_candidate=True), seed, noise=0.02)
    assert any(
        u.weights[0] < 0.2 - 1e-9 for u in plain.updates
    )  # the fallback took the target data away
    floored, floored_end = toy_run(
        FLAT_SLOPES, rule_set(lp_candidate=True, target_floor=0.2), seed, noise=0.02
    )
    fallbacks = [u for u in floored.updates if not u.rules.choice.feasible]
    assert fallbacks  # the case happens with the floor too
    assert any(
        not u.rules.find(TargetFloorRecord).floors.lifted_by for u in fallbacks
    )  # held in a fallback
    for update in floored.updates:
        record = update.rules.find(TargetFloorRecord).floors
        assert record.lifted_by in ([], [1])
        if not record.lifted_by:
            assert update.weights[0] >= 0.2 - 1e-9
    # More target data, a lower target loss, and the constraint's true value still at or
    # below its reference (the target data does not touch it).
    assert floored_end[0] < plain_end[0]
    assert floored_end[1] <= FLAT_INITIAL[1]


def test_the_floor_gives_way_where_the_target_data_breaks_a_constraint():
    # Target data harms the constraint far beyond the noise; d1 repairs it. 30% of the
    # mixture on the target data breaks the constraint (d1 offsets at most 20% of target
    # data: 4e-3 w = 1e-3 (1 - w)), so the floor gives way at every update, and the solver
    # keeps about as much target data as the constraint allows instead of none.
    harmful = np.array([[-2e-3, 0.0, 0.0], [4e-3, -1e-3, 0.0]])
    history, _ = toy_run(
        harmful, rule_set(lp_candidate=True, target_floor=0.3), seed=0, noise=0.002
    )
    assert all(u.rules.find(TargetFloorRecord).floors.lifted_by == [1] for u in history.updates)
    assert all(0.1 < u.weights[0] < 0.3 - 1e-6 for u in history.updates)

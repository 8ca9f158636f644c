"""Algorithms 1 and 2 on an analytic learner whose slopes are known exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dynamics.core.controller import SavedLoop, evaluation_steps, run_mixture_training
from dynamics.core.policies import DynamicsPolicy, FixedWeightsPolicy
from dynamics.core.schedules import build_schedule
from tests.core.toy_learner import ToyLearner

# Domains: 0 = target, 1 and 2 = constraints. Datasets: 0 teaches the target but harms
# constraint 1; 1 is general data that helps both constraints a little; 2 is neutral.
SLOPES = np.array(
    [
        [-0.010, -0.001, 0.000],
        [0.004, -0.001, 0.000],
        [0.001, -0.0005, 0.0],
    ]
)
INITIAL = np.array([3.0, 2.0, 2.5])


def run(policy, learner, eval_interval=16, reduced_batches=4):
    return run_mixture_training(
        learner,
        policy,
        targets=[0],
        constraints=[1, 2],
        eval_interval=eval_interval,
        reduced_batches=reduced_batches,
    )


def test_linear_probing_recovers_the_true_slopes_exactly():
    learner = ToyLearner(SLOPES, INITIAL)
    policy = DynamicsPolicy(build_schedule("no-warmup", 128))
    history = run(policy, learner)
    assert [u.step for u in history.updates] == list(policy.schedule.steps)
    for update in history.updates:
        np.testing.assert_allclose(update.slope_matrix, SLOPES, rtol=0, atol=1e-12)


def test_linear_toy_predictions_are_exact_and_realized_losses_are_recorded():
    learner = ToyLearner(SLOPES, INITIAL)
    history = run(DynamicsPolicy(build_schedule("dense-warmup", 128)), learner)
    for update in history.updates:
        assert update.realized_losses is not None
        np.testing.assert_allclose(update.prediction_error, 0.0, atol=1e-12)


def test_probing_leaves_the_learner_where_it_was():
    learner = ToyLearner(SLOPES, INITIAL)
    history = run(DynamicsPolicy(build_schedule("light-warmup", 128)), learner)
    # Probes are rolled back: only the main run's 128 steps count.
    assert learner.trained_steps == 128
    weights = np.array([u.weights for u in history.updates])
    horizons = np.array([u.horizon for u in history.updates])
    np.testing.assert_allclose(learner.steps_per_dataset, horizons @ weights, atol=1e-12)


def test_constraint_is_kept_and_target_improves():
    learner = ToyLearner(SLOPES, INITIAL)
    history = run(DynamicsPolicy(build_schedule("no-warmup", 128)), learner)
    first, last = history.evaluations[0], history.evaluations[-1]
    assert last.step == 128
    assert np.all(last.eval[1:] <= first.eval[1:] + 1e-9)
    assert last.eval[0] < first.eval[0]
    # Dataset 0 alone would break constraint 1, so the solver must mix in dataset 1.
    for update in history.updates:
        assert update.weights[0] < 1.0
        assert update.solver["feasible"]


def test_recycling_reuses_the_main_evaluation_on_evaluation_steps():
    learner = ToyLearner(SLOPES, INITIAL)
    schedule = build_schedule([0, 8, 16, 40], 64)
    history = run(DynamicsPolicy(schedule), learner, eval_interval=16, reduced_batches=4)
    recycled = {u.step: u.recycled_anchor for u in history.updates}
    assert recycled == {0: True, 8: False, 16: True, 40: False}
    reduced = [e for e in learner.evaluations if e == ("eval", 4)]
    # One reduced evaluation per probe (3 datasets x 4 updates) plus 2 fresh anchors.
    assert len(reduced) == 3 * 4 + 2
    assert [e.step for e in history.evaluations] == evaluation_steps(64, 16) == [0, 16, 32, 48, 64]


def test_anchor_uses_exactly_the_probe_batches():
    # With per-batch offsets, a recycled anchor over all batches would bias the slopes;
    # the anchor is the mean over the probe's first R batches, so slopes stay exact.
    learner = ToyLearner(SLOPES, INITIAL, num_batches=10)
    history = run(
        DynamicsPolicy(build_schedule([0], 32)), learner, eval_interval=32, reduced_batches=3
    )
    update = history.updates[0]
    np.testing.assert_allclose(
        update.current_losses, INITIAL + learner.offsets["eval"][:, :3].mean(axis=1)
    )
    np.testing.assert_allclose(update.slope_matrix, SLOPES, atol=1e-12)


def test_fixed_weights_policy_trains_one_mixture():
    learner = ToyLearner(SLOPES, INITIAL)
    history = run(FixedWeightsPolicy(np.array([1.0, 1.0, 2.0]), total_steps=64), learner)
    assert len(history.updates) == 1
    np.testing.assert_allclose(history.updates[0].weights, [0.25, 0.25, 0.5])
    np.testing.assert_allclose(learner.steps_per_dataset, [16, 16, 32])
    assert all(np.allclose(e.weights, [0.25, 0.25, 0.5]) for e in history.evaluations)


def test_the_loop_announces_each_phase_before_it_starts():
    from dynamics.core.controller import LoopCallbacks

    phases: list[tuple[str, int]] = []
    learner = ToyLearner(SLOPES, INITIAL)
    run_mixture_training(
        learner,
        DynamicsPolicy(build_schedule([0, 8], 32)),
        targets=[0],
        constraints=[1],
        eval_interval=16,
        reduced_batches=4,
        callbacks=LoopCallbacks(on_phase=lambda phase, step: phases.append((phase, step))),
    )
    assert phases == [
        ("evaluation", 0),
        ("update", 0),
        ("training", 0),
        ("update", 8),
        ("training", 8),
        ("evaluation", 16),
        ("training", 16),
        ("evaluation", 32),
    ]


def test_reduced_batches_larger_than_main_evaluation_is_an_error():
    learner = ToyLearner(SLOPES, INITIAL, num_batches=2)
    with pytest.raises(ValueError, match="reduced_batches"):
        run(DynamicsPolicy(build_schedule([0], 16)), learner, reduced_batches=3)


def test_curve_predictor_beats_linear_extrapolation_on_saturating_losses():
    # Each dataset's effect saturates: a_ij * (1 - exp(-n_j / tau)). Probes of c = 16 steps
    # extrapolated to H = 64 overshoot linearly; a fitted exponential does not.
    tau = 24.0
    amplitudes = SLOPES * 40.0

    def saturating(steps):
        return amplitudes @ (1.0 - np.exp(-steps / tau))

    errors = {}
    for predictor in ("linear", "curve"):
        learner = ToyLearner(SLOPES, INITIAL, effect=saturating)
        schedule = build_schedule([0, 64], 128, probe_cap=16)
        history = run(DynamicsPolicy(schedule, predictor=predictor), learner, eval_interval=64)
        errors[predictor] = np.mean([np.abs(u.prediction_error).mean() for u in history.updates])
    assert errors["curve"] < 0.5 * errors["linear"]


# Backtracking (an option beyond the paper). Dataset 0 teaches the target; its harm to the
# constraint grows with the square of the steps trained on it, so short probes see almost
# none of it and the linear prediction lets the constraint break at a main evaluation.
HIDDEN_SLOPES = np.array([[-0.02, -0.002], [0.0, -0.0005]])
HIDDEN_INITIAL = np.array([3.0, 2.0])


def hidden_harm(steps):
    return HIDDEN_SLOPES @ steps + np.array([0.0, 2e-4]) * steps[0] ** 2


class RecordingPolicy:
    """Wraps a policy and keeps the learner state each decision started from."""

    def __init__(self, policy):
        self.inner = policy
        self.states = []

    name = property(lambda self: self.inner.name)
    schedule = property(lambda self: self.inner.schedule)

    def decide(self, learner, context):
        self.states.append((context.step, learner.snapshot(), context.reference_losses.copy()))
        return self.inner.decide(learner, context)


class StateLoggingLearner(ToyLearner):
    """Keeps the state every main evaluation saw, by the step it was taken at."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.main_eval_states = {}

    def evaluate(self, split, num_batches=None):
        if split == "eval" and num_batches is None:
            self.main_eval_states.setdefault(self.trained_steps, self.snapshot())
        return super().evaluate(split, num_batches)


def run_hidden(max_backtracks, backtrack_patience=1):
    learner = StateLoggingLearner(HIDDEN_SLOPES, HIDDEN_INITIAL, effect=hidden_harm)
    policy = RecordingPolicy(DynamicsPolicy(build_schedule([0, 32], 96, probe_cap=4)))
    history = run_mixture_training(
        learner,
        policy,
        targets=[0],
        constraints=[1],
        eval_interval=16,
        reduced_batches=4,
        max_backtracks=max_backtracks,
        backtrack_patience=backtrack_patience,
    )
    return learner, policy, history


def test_without_backtracking_the_hidden_harm_breaks_the_constraint():
    _, _, history = run_hidden(max_backtracks=0)
    assert not history.backtracks
    reference = history.evaluations[0].eval[1]
    assert any(e.eval[1] > reference + 1e-6 for e in history.evaluations)


def test_backtracking_returns_to_the_exact_feasible_state_and_keeps_the_constraint():
    learner, policy, history = run_hidden(max_backtracks=3)
    assert history.backtracks
    reference = history.evaluations[0]
    for backtrack in history.backtracks:
        # The re-decision starts from exactly the state the main evaluation at that step saw
        # (48 here: inside the update made at 32, so the policy decides at an unscheduled step).
        redecided = [snap for s, snap, _ in policy.states if s == backtrack["to_step"]][-1]
        saved = learner.main_eval_states[backtrack["to_step"]]
        np.testing.assert_array_equal(redecided[0], saved[0])
        assert redecided[1] == saved[1] == backtrack["to_step"]
        assert backtrack["violations"]["e1"] > 0
    # Every state the run kept holds the constraint; the abandoned ones are marked.
    for e in history.kept_evaluations:
        assert e.eval[1] <= reference.eval[1] + 1e-9
    assert sum(e.backtracked for e in history.evaluations) == len(history.backtracks)
    # The learned margin lowers the reference the policy sees, by the violation seen.
    first = history.backtracks[0]
    later_refs = [ref[1] for s, _, ref in policy.states if s >= first["to_step"]][-1]
    assert later_refs <= policy.states[0][2][1] - first["violations"]["e1"] + 1e-12
    # The learner trained the kept updates' steps only: abandoned branches were rolled back.
    kept = [u for u in history.updates if not u.abandoned]
    ends = [u.step for u in kept[1:]] + [96]  # an update cut short by a backtrack ends early
    steps = sum((end - u.step) * u.weights for u, end in zip(kept, ends, strict=True))
    np.testing.assert_allclose(learner.steps_per_dataset, steps, atol=1e-9)
    assert learner.trained_steps == 96
    assert any(u.backtrack is not None for u in kept)


def test_backtracking_stops_after_max_backtracks():
    _, _, history = run_hidden(max_backtracks=1)
    assert len(history.backtracks) == 1
    with pytest.raises(ValueError, match="max_backtracks"):
        run_hidden(max_backtracks=-1)


def test_backtrack_patience_returns_only_after_broken_evaluations_in_a_row():
    _, _, eager = run_hidden(max_backtracks=1)
    _, _, patient = run_hidden(max_backtracks=1, backtrack_patience=2)
    first = patient.backtracks[0]
    reference = patient.evaluations[0].eval[1]
    left = [e for e in patient.evaluations if e.backtracked]
    # Both evaluations of the streak broke the constraint and both are left behind, not kept.
    assert [e.step for e in left] == [first["from_step"] - 16, first["from_step"]]
    assert all(e.eval[1] > reference + 1e-9 for e in left)
    kept_steps = [e.step for e in patient.kept_evaluations]
    assert kept_steps == sorted(set(kept_steps)) == list(range(0, 97, 16))  # one kept branch
    # The first broken evaluation alone returns the eager run; the patient one waits one more.
    assert first["from_step"] == eager.backtracks[0]["from_step"] + 16
    assert first["to_step"] == eager.backtracks[0]["to_step"]
    with pytest.raises(ValueError, match="backtrack_patience"):
        run_hidden(max_backtracks=1, backtrack_patience=0)


class Crash(Exception):
    pass


def records_of(history):
    """The history's records without their wall times (the only thing allowed to differ)."""

    def untimed(row):
        return {k: v for k, v in row.items() if not k.endswith("_seconds")}

    return (
        [untimed(e.to_dict()) for e in history.evaluations],
        [untimed(u.to_dict()) for u in history.updates],
        history.backtracks,
    )


@pytest.mark.parametrize("crash_after", [16, 48, 64])
def test_a_run_resumed_from_a_checkpoint_equals_the_uninterrupted_run(crash_after):
    import copy

    from dynamics.core.controller import LoopCallbacks
    from dynamics.core.rules import RuleSet

    def fresh():
        learner = StateLoggingLearner(HIDDEN_SLOPES, HIDDEN_INITIAL, effect=hidden_harm)
        # Without diminishing returns this toy's hidden harm makes the run backtrack, so the
        # loop's backtracking state crosses the save.
        options = RuleSet.of_variant("robust").replaced(gain_exponent=1.0)
        policy = DynamicsPolicy(build_schedule([0, 8, 32], 96, probe_cap=4), rules=options)
        return learner, policy

    kwargs = dict(
        targets=[0], constraints=[1], eval_interval=16, reduced_batches=4, max_backtracks=2
    )
    checkpoints = range(8, 96, 8)
    learner, policy = fresh()
    full = run_mixture_training(learner, policy, checkpoint_steps=checkpoints, **kwargs)
    assert full.backtracks  # the case where the loop's own state matters most

    saved = {}

    def save(controller):
        # What the engine writes to disk: the loop's state (through JSON, as in a resume
        # point) and the learner's, at this point.
        saved["loop"] = SavedLoop(
            json.loads(json.dumps(controller.state_dict())),
            copy.deepcopy(controller.feasible_snapshot),
        )
        saved["learner"] = learner_a.snapshot()

    def crash(steps, step_now):
        if step_now > crash_after:
            raise Crash

    learner_a, policy_a = fresh()
    with pytest.raises(Crash):
        run_mixture_training(
            learner_a,
            policy_a,
            checkpoint_steps=checkpoints,
            callbacks=LoopCallbacks(on_train=crash, on_checkpoint=save),
            **kwargs,
        )
    assert saved["loop"].state["step"] <= crash_after
    learner_b, policy_b = fresh()
    learner_b.restore(saved["learner"])
    resumed = run_mixture_training(
        learner_b, policy_b, checkpoint_steps=checkpoints, resume=saved["loop"], **kwargs
    )
    assert records_of(resumed) == records_of(full)
    np.testing.assert_array_equal(learner_b.steps_per_dataset, learner.steps_per_dataset)


def test_resume_refuses_a_changed_schedule():

    from dynamics.core.controller import LoopCallbacks

    saved = []
    learner = ToyLearner(SLOPES, INITIAL)
    run_mixture_training(
        learner,
        DynamicsPolicy(build_schedule([0, 32], 64)),
        targets=[0],
        constraints=[1, 2],
        eval_interval=16,
        reduced_batches=4,
        checkpoint_steps=[16],
        callbacks=LoopCallbacks(
            on_checkpoint=lambda controller: saved.append(SavedLoop(controller.state_dict()))
        ),
    )
    assert [point.state["step"] for point in saved] == [16]
    with pytest.raises(ValueError, match="checkpoint interval changed"):
        run_mixture_training(
            ToyLearner(SLOPES, INITIAL),
            DynamicsPolicy(build_schedule([0, 32], 64)),
            targets=[0],
            constraints=[1, 2],
            eval_interval=8,
            reduced_batches=4,
            checkpoint_steps=[16],
            resume=saved[0],
        )


class DivergingLearner(ToyLearner):
    """A probe on any dataset in ``diverging`` reaches a non-finite loss (``raises``) or
    leaves the model evaluating to NaN."""

    def __init__(self, *args, diverging=(), raises=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.diverging = set(diverging)
        self.raises = raises
        self.poisoned = False

    def probe(self, steps, dataset):
        super().probe(steps, dataset)
        if dataset in self.diverging:
            if self.raises:
                from dynamics.core.learner import Diverged

                raise Diverged(f"probe on d{dataset}")
            self.poisoned = True

    def evaluate(self, split, num_batches=None):
        evaluation = super().evaluate(split, num_batches)
        if self.poisoned:
            from dynamics.core.learner import Evaluation

            return Evaluation(evaluation.per_batch * np.nan)
        return evaluation

    def restore(self, snapshot):
        super().restore(snapshot)
        self.poisoned = False


@pytest.mark.parametrize("variant", ["paper", "robust"])
@pytest.mark.parametrize("raises", [True, False], ids=["non-finite-loss", "nan-evaluation"])
def test_a_diverged_probe_leaves_its_dataset_out_of_that_update(raises, variant):
    from dynamics.core.rules import RuleSet

    learner = DivergingLearner(SLOPES, INITIAL, diverging={0}, raises=raises)
    history = run(
        DynamicsPolicy(build_schedule([0, 32], 64), rules=RuleSet.of_variant(variant)), learner
    )
    for update in history.updates:
        assert update.unreliable_datasets == ["d0"]
        assert update.weights[0] == 0.0 and abs(update.weights.sum() - 1) < 1e-12
        assert np.isnan(update.slope_matrix[:, 0]).all()
        np.testing.assert_allclose(update.slope_matrix[:, 1:], SLOPES[:, 1:], atol=1e-12)
        assert np.isnan(np.asarray(update.slope_errors)[:, 0]).all()
    # The diverged probes were rolled back like any other: only the main run trained.
    assert learner.trained_steps == 64 and learner.steps_per_dataset[0] == 0


def test_every_probe_diverging_stops_the_run_with_a_clear_message():
    from dynamics.core.learner import Diverged

    learner = DivergingLearner(SLOPES, INITIAL, diverging={0, 1, 2})
    with pytest.raises(Diverged, match="every probe at step 0"):
        run(DynamicsPolicy(build_schedule([0, 32], 64)), learner)

"""Algorithm 2: the one training loop every mixture policy runs in.

:class:`MixtureController` owns the loop's state and the schedule of main evaluations
(every ``eval_interval`` steps, on the eval and test splits, plus the final step) and of
mixture updates (the policy's update steps). A driver asks it what to do next
(:meth:`MixtureController.next`): the controller evaluates, probes and solves through the
:class:`~dynamics.core.learner.Learner` protocol itself, and hands back a
:class:`TrainRequest` wherever the main run must train, because only the driver can train
(``dynamics run`` calls ``learner.train``; inside a transformers Trainer the Trainer's own
loop takes the steps), or :class:`Finished` after the final evaluation.

At an update the controller hands the policy an :class:`UpdateContext` holding the
reduced-evaluation anchor ``L_i(theta_t)``; when the update falls on a main-evaluation step
the anchor is recycled from that evaluation's first ``reduced_batches`` batches instead of
evaluating again (appendix H, "evaluation recycling").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynamics.core.learner import Evaluation, Learner
from dynamics.core.metrics import TIE_TOLERANCE, constraint_slack
from dynamics.core.policy_interface import MixturePolicy, UpdateContext
from dynamics.core.records import EvaluationRecord, RunHistory, UpdateRecord
from dynamics.core.schedules import UpdateSchedule


@dataclass
class LoopCallbacks:
    """Side concerns (files, progress bars, trackers) hook in here, never in the logic."""

    on_evaluation: Callable[[EvaluationRecord, RunHistory], None] | None = None
    on_update: Callable[[UpdateRecord, RunHistory], None] | None = None
    on_train: Callable[[int, int], None] | None = None  # (steps just trained, step now)
    on_checkpoint: Callable[[MixtureController], None] | None = None  # at a resume point
    on_phase: Callable[[str, int], None] | None = None
    """(phase, step) as the loop starts a phase: "evaluation" (a main evaluation),
    "update" (the policy probing and solving) or "training"."""

    def phase(self, name: str, step: int) -> None:
        if self.on_phase is not None:
            self.on_phase(name, step)


def evaluation_steps(total_steps: int, eval_interval: int) -> list[int]:
    """Main evaluations: step 0, every ``eval_interval`` steps, and the final step."""
    steps = list(range(0, total_steps + 1, eval_interval))
    if steps[-1] != total_steps:
        steps.append(total_steps)
    return steps


@dataclass
class FeasibleState:
    """Where backtracking returns to: the last main evaluation that kept every constraint."""

    event_index: int
    step: int
    evaluation: Evaluation
    snapshot: Any  # the learner's, taken right after that evaluation
    num_updates: int  # updates recorded before this step's own update


def _unscheduled_update(schedule: UpdateSchedule, step: int) -> tuple[int, int]:
    """Horizon and probe budget of an update at ``step`` outside the schedule: it runs to the
    next scheduled update; its probes are no longer than the update in force, nor shorter than
    probe_min."""
    later = [s for s in schedule.steps if s > step]
    horizon = (later[0] if later else schedule.total_steps) - step
    in_force = max(s for s in schedule.steps if s <= step)
    return horizon, max(min(horizon, schedule.probe_budget(in_force)), schedule.probe_min)


def loop_events(
    total_steps: int,
    eval_interval: int,
    schedule: UpdateSchedule,
    checkpoint_steps: Collection[int],
) -> list[int]:
    """The steps the loop stops at: main evaluations, updates and resume points."""
    checkpoints = {s for s in checkpoint_steps if 0 < s < total_steps}
    return sorted(
        set(evaluation_steps(total_steps, eval_interval)) | set(schedule.steps) | checkpoints
    )


@dataclass(frozen=True)
class TrainRequest:
    """Train ``steps`` optimizer steps on mixture ``weights``, which bring the run to step
    ``until``; then ask the controller again."""

    steps: int
    weights: np.ndarray
    until: int


@dataclass(frozen=True)
class Finished:
    """The final evaluation is done: ``history`` is everything the run produced."""

    history: RunHistory


class MixtureController:
    """Algorithm 2 (paper section 3.4) as an object a driver asks what to do next.

    Each call of :meth:`next` carries the loop from where it stands to the next stretch of
    training: at each of its stops (:func:`loop_events`) it :meth:`_evaluates` on both
    splits at a main-evaluation step, may :meth:`_backtrack`, :meth:`_updates_the_mixture`
    at an update step (the policy probes and solves), reports the evaluation, and saves a
    resume point; then it returns a :class:`TrainRequest`, or :class:`Finished` at the end.

    ``reduced_batches`` is R, the number of evaluation batches per domain a probe uses; the
    main evaluation uses all of the learner's batches.

    ``max_backtracks`` > 0 turns on backtracking, an option beyond the paper (which leaves
    it to future work): when a main evaluation shows a constraint above its reference on
    the eval split, the learner returns to the last main evaluation that kept every
    constraint (parameters, optimizer, scheduler, RNG and data positions, as in a probe),
    each broken constraint's reference is lowered by the violation just seen for the rest
    of the run (a margin learned from the miss), and the policy decides again there. The
    abandoned evaluations stay in the history marked ``backtracked``, the abandoned
    updates are marked ``abandoned``, and the new update carries the ``backtrack``.
    ``backtrack_patience`` main evaluations in a row must show a broken constraint before
    the run returns (1: the first one), so that a violation that training repairs by the
    next evaluation costs no steps trained again.

    At every step of ``checkpoint_steps`` the controller hands itself to
    ``callbacks.on_checkpoint``: its :meth:`state_dict` (plain JSON-able data) and its
    :attr:`feasible_snapshot` (the learner's, for backtracking) are then what a resume
    point keeps. A controller built the same way and given them back by
    :meth:`load_state_dict` (with the learner and the policy restored to that point)
    continues the run exactly where it stood. The resume points split training stretches,
    so a run resumed or not takes the same steps in the same calls.
    """

    def __init__(
        self,
        learner: Learner,
        policy: MixturePolicy,
        *,
        targets: Sequence[int],
        constraints: Sequence[int],
        eval_interval: int,
        reduced_batches: int,
        callbacks: LoopCallbacks | None = None,
        max_backtracks: int = 0,
        backtrack_patience: int = 1,
        checkpoint_steps: Collection[int] = (),
    ) -> None:
        schedule = policy.schedule
        if eval_interval < 1:
            raise ValueError(
                f"eval_interval must be a positive number of steps, got {eval_interval}"
            )
        if reduced_batches < 1:
            raise ValueError(f"reduced_batches must be >= 1, got {reduced_batches}")
        if max_backtracks < 0:
            raise ValueError(f"max_backtracks must be >= 0, got {max_backtracks}")
        if backtrack_patience < 1:
            raise ValueError(f"backtrack_patience must be >= 1, got {backtrack_patience}")
        if not schedule.steps or schedule.steps[0] != 0:
            raise ValueError("the policy's schedule must start at step 0")
        self.learner = learner
        self.policy = policy
        self.schedule = schedule
        self.reduced_batches = reduced_batches
        self.callbacks = callbacks or LoopCallbacks()
        self.max_backtracks = max_backtracks
        self.backtrack_patience = backtrack_patience
        self.checkpoint_steps = set(checkpoint_steps)
        self.eval_steps = evaluation_steps(schedule.total_steps, eval_interval)
        self.events = loop_events(schedule.total_steps, eval_interval, schedule, checkpoint_steps)
        self.history = RunHistory(
            dataset_names=list(learner.dataset_names),
            domain_names=list(learner.domain_names),
            targets=tuple(targets),
            constraints=tuple(constraints),
        )
        # The loop's state: everything state_dict saves.
        self.event_index = 0
        self.reference_losses: np.ndarray | None = (
            None  # probe-batch references, NaN for non-constraints
        )
        self.margins = np.zeros(len(self.history.domain_names))
        self.weights: np.ndarray | None = None  # the mixture in force
        self.last_update: UpdateRecord | None = (
            None  # the latest update not abandoned by a backtrack
        )
        self.feasible: FeasibleState | None = None
        self._backtrack: dict[str, Any] | None = (
            None  # set while deciding again at a restored state
        )
        self._resumed = (
            False  # the current stop's evaluation, update and callbacks happened before the save
        )

    @property
    def step(self) -> int:
        return self.events[self.event_index]

    # --- Algorithm 2 -------------------------------------------------------------------

    def next(self) -> TrainRequest | Finished:
        """Evaluate, update and save up to the next stretch of training, and say what to train."""
        while True:
            step = self.step
            main_eval: Evaluation | None = None
            if not self._resumed:
                if self._backtrack is not None:
                    assert self.feasible is not None
                    main_eval = self.feasible.evaluation  # recorded already, before the backtrack
                elif step in self.eval_steps:
                    main_eval = self._evaluates(step)
                    if self._should_backtrack():
                        self._backtrack_from(step)
                        continue  # decide again at the restored state
                if step in self.schedule or self._backtrack is not None:
                    self._updates_the_mixture(step, main_eval)
                if main_eval is not None and self._backtrack is None:
                    self._reports_the_evaluation()
            self._backtrack = None
            if step == self.schedule.total_steps:
                return self._finishes(main_eval)
            assert (
                self.weights is not None and self.reference_losses is not None
            )  # step 0 evaluates and updates
            if (
                step in self.checkpoint_steps
                and not self._resumed
                and self.callbacks.on_checkpoint is not None
            ):
                self.callbacks.on_checkpoint(self)
            self._resumed = False
            self.callbacks.phase("training", step)
            self.event_index += 1
            return TrainRequest(self.step - step, self.weights.copy(), self.step)

    def _evaluates(self, step: int) -> Evaluation:
        """A main evaluation on both splits; at step 0 it also sets the references
        ``L_i^ref = L_i(theta_0)`` on the probe's batches (docs/method.md)."""
        self.callbacks.phase("evaluation", step)
        started = time.perf_counter()
        main_eval = self.learner.evaluate("eval")
        test_eval = self.learner.evaluate("test")
        if main_eval.num_batches < self.reduced_batches:
            raise ValueError(
                f"the main evaluation has {main_eval.num_batches} batches per domain, fewer than "
                f"the {self.reduced_batches} reduced batches the probes use: lower reduced_batches"
            )
        if self.reference_losses is None:
            self.reference_losses = np.full(len(self.history.domain_names), np.nan)
            idx = list(self.history.constraints)
            self.reference_losses[idx] = main_eval.means(self.reduced_batches)[idx]
        self.history.evaluations.append(
            EvaluationRecord(
                step=step,
                eval=main_eval.means(),
                test=test_eval.means(),
                weights=np.array([]) if self.weights is None else self.weights.copy(),
                wall_seconds=time.perf_counter() - started,
                eval_batches=main_eval.per_batch.copy(),
            )
        )
        if self.max_backtracks and self._constraints_held():
            self.feasible = FeasibleState(
                self.event_index,
                step,
                main_eval,
                self.learner.snapshot(),
                len(self.history.updates),
            )
        return main_eval

    def _constraint_slack(self) -> np.ndarray:
        history = self.history
        return constraint_slack(
            history.evaluations[-1], history.evaluations[0], history.constraints
        )

    def _constraints_held(self) -> bool:
        return bool((self._constraint_slack() >= -TIE_TOLERANCE).all())

    def _should_backtrack(self) -> bool:
        if self.max_backtracks == 0 or self.feasible is None or self._constraints_held():
            return False
        # Every kept evaluation after the last feasible one broke a constraint: that many in a row.
        broken_in_a_row = sum(e.step > self.feasible.step for e in self.history.kept_evaluations)
        return (
            broken_in_a_row >= self.backtrack_patience
            and len(self.history.backtracks) < self.max_backtracks
        )

    def _backtrack_from(self, step: int) -> None:
        """Mark the evaluations and updates since the last feasible state as left behind,
        lower each broken constraint's reference by its violation, and return the learner to
        that state."""
        history, feasible = self.history, self.feasible
        assert feasible is not None
        record = history.evaluations[-1]
        for left in history.evaluations:  # with patience, the broken evaluations before it too
            left.backtracked = left.backtracked or left.step > feasible.step
        if self.callbacks.on_evaluation is not None:
            self.callbacks.on_evaluation(record, history)
        slack = self._constraint_slack()
        broken = {
            history.domain_names[k]: float(-s)
            for k, s in zip(history.constraints, slack, strict=True)
            if s < -TIE_TOLERANCE
        }
        for k, s in zip(history.constraints, slack, strict=True):
            self.margins[k] += max(0.0, float(-s))
        for update in history.updates[feasible.num_updates :]:
            update.abandoned = True
        live = [u for u in history.updates if not u.abandoned]
        self.last_update = live[-1] if live else None
        if (
            self.last_update is not None
            and self.last_update.step + self.last_update.horizon > feasible.step
        ):
            self.last_update.realized_losses = None  # reached only on the abandoned branch
        self._backtrack = {
            "from_step": step,
            "to_step": feasible.step,
            "violations": broken,
            "margins": {
                history.domain_names[k]: float(self.margins[k]) for k in history.constraints
            },
            "retrained_steps": step - feasible.step,
        }
        history.backtracks.append(self._backtrack)
        self.learner.restore(feasible.snapshot)
        self.event_index = feasible.event_index

    def _updates_the_mixture(self, step: int, main_eval: Evaluation | None) -> None:
        """Algorithm 2's ``if t in U``: anchor, probe and solve through the policy."""
        self.callbacks.phase("update", step)
        learner, history, last = self.learner, self.history, self.last_update
        anchor = (
            main_eval.reduced(self.reduced_batches)
            if main_eval is not None
            else learner.evaluate("eval", self.reduced_batches)
        )
        if last is not None and last.step + last.horizon == step:
            # Realized at the end of its horizon; an update cut short by a backtrack keeps
            # no realized losses.
            last.realized_losses = anchor.means()
        assert self.reference_losses is not None  # step 0 is always evaluated first
        horizon, probe_budget = (
            (self.schedule.horizon(step), self.schedule.probe_budget(step))
            if step in self.schedule
            else _unscheduled_update(self.schedule, step)
        )
        context = UpdateContext(
            step=step,
            horizon=horizon,
            probe_budget=probe_budget,
            anchor=anchor,
            recycled_anchor=main_eval is not None,
            reference_losses=self.reference_losses - self.margins,
            targets=history.targets,
            constraints=history.constraints,
            reduced_batches=self.reduced_batches,
            domain_kinds=tuple(learner.domain_kinds),
            after_backtrack=self._backtrack is not None,
        )
        update = self.policy.decide(learner, context)
        if self._backtrack is not None:
            update.backtrack = self._backtrack
        elif self.margins.any():
            update.margins = {
                history.domain_names[k]: float(self.margins[k]) for k in history.constraints
            }
        self.weights = np.asarray(update.weights, dtype=float)
        history.updates.append(update)
        self.last_update = update
        if self.callbacks.on_update is not None:
            self.callbacks.on_update(update, history)

    def _reports_the_evaluation(self) -> None:
        """The weights in force from this step on are known only after a same-step update."""
        record = self.history.evaluations[-1]
        record.weights = np.array([]) if self.weights is None else self.weights.copy()
        if self.callbacks.on_evaluation is not None:
            self.callbacks.on_evaluation(record, self.history)

    def _finishes(self, main_eval: Evaluation | None) -> Finished:
        # The final evaluation closes the last update's horizon.
        if self.last_update is not None and main_eval is not None:
            self.last_update.realized_losses = main_eval.means(self.reduced_batches)
        return Finished(self.history)

    # --- state -------------------------------------------------------------------------

    @property
    def feasible_snapshot(self) -> Any:
        """The learner's snapshot at the last feasible main evaluation (None without one):
        a resume point keeps it beside :meth:`state_dict`, which holds everything else."""
        return None if self.feasible is None else self.feasible.snapshot

    def state_dict(self) -> dict[str, Any]:
        """The loop's state at the stop it stands at, as plain JSON-able data: the run's
        history, references and margins, the mixture in force, the policy's state, and the
        last feasible evaluation (without the learner snapshot: :attr:`feasible_snapshot`)."""
        history, feasible = self.history, self.feasible
        assert self.reference_losses is not None and self.weights is not None
        return {
            "event_index": self.event_index,
            "step": self.step,
            "reference_losses": [None if np.isnan(v) else float(v) for v in self.reference_losses],
            "margins": self.margins.tolist(),
            "weights": self.weights.tolist(),
            "last_update": None
            if self.last_update is None
            else next(i for i, u in enumerate(history.updates) if u is self.last_update),
            "policy_state": self.policy.state_dict(),
            "history": {
                "dataset_names": history.dataset_names,
                "domain_names": history.domain_names,
                "targets": list(history.targets),
                "constraints": list(history.constraints),
                "evaluations": [e.to_dict() for e in history.evaluations],
                "updates": [u.to_dict() for u in history.updates],
                "backtracks": history.backtracks,
            },
            "feasible": None
            if feasible is None
            else {
                "event_index": feasible.event_index,
                "step": feasible.step,
                "evaluation": feasible.evaluation.per_batch.tolist(),
                "evaluation_expected": None
                if (kept := feasible.evaluation.expected) is None
                else kept.tolist(),
                "num_updates": feasible.num_updates,
            },
        }

    def load_state_dict(self, state: dict[str, Any], feasible_snapshot: Any = None) -> None:
        """Stand where :meth:`state_dict` was taken; ``feasible_snapshot`` is the learner
        snapshot of its feasible state (required when it has one). The next :meth:`next`
        trains on from that stop without repeating its evaluation, update or save."""
        event_index, step = int(state["event_index"]), int(state["step"])
        if event_index >= len(self.events) or self.events[event_index] != step:
            raise ValueError(
                f"the saved state stands at step {step}, which is not the loop's event "
                f"{event_index}: the schedule, evaluation interval or checkpoint interval changed"
            )
        saved = state["history"]
        self.history = RunHistory(
            dataset_names=list(saved["dataset_names"]),
            domain_names=list(saved["domain_names"]),
            targets=tuple(saved["targets"]),
            constraints=tuple(saved["constraints"]),
            evaluations=[EvaluationRecord.from_dict(row) for row in saved["evaluations"]],
            updates=[UpdateRecord.from_dict(row) for row in saved["updates"]],
            backtracks=list(saved["backtracks"]),
        )
        self.event_index = event_index
        self.reference_losses = np.array(
            [np.nan if v is None else v for v in state["reference_losses"]], dtype=float
        )
        self.margins = np.asarray(state["margins"], dtype=float)
        self.weights = np.asarray(state["weights"], dtype=float)
        last = state["last_update"]
        self.last_update = None if last is None else self.history.updates[last]
        feasible = state["feasible"]
        if feasible is not None and feasible_snapshot is None:
            raise ValueError(
                "the saved state has a feasible state to backtrack to: pass its learner snapshot"
            )
        self.feasible = (
            None
            if feasible is None
            else FeasibleState(
                event_index=int(feasible["event_index"]),
                step=int(feasible["step"]),
                evaluation=Evaluation(
                    np.array(feasible["evaluation"], dtype=float),
                    _array(feasible.get("evaluation_expected")),
                ),
                snapshot=feasible_snapshot,
                num_updates=int(feasible["num_updates"]),
            )
        )
        self.policy.load_state_dict(state["policy_state"])
        self._backtrack = None
        self._resumed = True


@dataclass(frozen=True)
class SavedLoop:
    """A controller's saved state: :meth:`MixtureController.state_dict` and its learner
    snapshot of the feasible state (what a resume point keeps)."""

    state: dict[str, Any]
    feasible_snapshot: Any = None


def run_mixture_training(
    learner: Learner,
    policy: MixturePolicy,
    *,
    targets: Sequence[int],
    constraints: Sequence[int],
    eval_interval: int,
    reduced_batches: int,
    callbacks: LoopCallbacks | None = None,
    max_backtracks: int = 0,
    backtrack_patience: int = 1,
    checkpoint_steps: Collection[int] = (),
    resume: SavedLoop | None = None,
) -> RunHistory:
    """Train for ``policy.schedule.total_steps`` steps, updating weights on schedule: a
    :class:`MixtureController` whose training requests ``learner.train`` carries out."""
    callbacks = callbacks or LoopCallbacks()
    controller = MixtureController(
        learner,
        policy,
        targets=targets,
        constraints=constraints,
        eval_interval=eval_interval,
        reduced_batches=reduced_batches,
        callbacks=callbacks,
        max_backtracks=max_backtracks,
        backtrack_patience=backtrack_patience,
        checkpoint_steps=checkpoint_steps,
    )
    if resume is not None:
        controller.load_state_dict(resume.state, resume.feasible_snapshot)
    while True:
        request = controller.next()
        if isinstance(request, Finished):
            return request.history
        learner.train(request.steps, request.weights)
        if callbacks.on_train is not None:
            callbacks.on_train(request.steps, request.until)


def _array(values: list[Any] | None) -> np.ndarray | None:
    return None if values is None else np.array(values, dtype=float)

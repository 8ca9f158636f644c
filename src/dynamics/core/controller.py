"""Algorithm 2: the one training loop every mixture policy runs in.

The loop owns the schedule of main evaluations (every ``eval_interval`` steps, on the eval
and test splits, plus the final step) and of mixture updates (the policy's update steps).
At an update it hands the policy an :class:`UpdateContext` holding the reduced-evaluation
anchor ``L_i(theta_t)``; when the update falls on a main-evaluation step the anchor is
recycled from that evaluation's first ``reduced_batches`` batches instead of evaluating
again (appendix H, "evaluation recycling").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from dynamics.core.learner import DomainKind, Evaluation, Learner
from dynamics.core.metrics import TIE_TOLERANCE, constraint_slack
from dynamics.core.records import EvaluationRecord, UpdateRecord
from dynamics.core.schedules import UpdateSchedule


@dataclass(frozen=True)
class UpdateContext:
    """What a policy sees at update step ``step``.

    anchor:            reduced evaluation at theta_t, shape (M, R) per batch.
    reference_losses:  step-0 values on the same R batches, NaN for non-constraints
                       (the solver's references use the probe's batches), lowered by
                       the margins backtracking learned.
    domain_kinds:      each domain's metric and evaluation batch size.
    weights_in_force:  the mixture trained on up to this step (None at the first update).
    """

    step: int
    horizon: int
    probe_budget: int
    anchor: Evaluation
    recycled_anchor: bool
    reference_losses: np.ndarray
    targets: tuple[int, ...]
    constraints: tuple[int, ...]
    reduced_batches: int
    domain_kinds: tuple[DomainKind, ...]
    weights_in_force: np.ndarray | None
    after_backtrack: bool = False  # the learner was just returned to this step's state


class MixturePolicy(Protocol):
    """A way of choosing mixture weights: DynaMiCS, fixed weights, gradient alignment."""

    @property
    def name(self) -> str: ...

    @property
    def schedule(self) -> UpdateSchedule:
        """When the policy recomputes weights; always contains step 0."""
        ...

    def decide(self, learner: Learner, context: UpdateContext) -> UpdateRecord:
        """Return the update record (with the new weights). The learner must be left in
        exactly the state it was given in."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What the policy carries from one update to the next (JSON-able), for resume."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class RunHistory:
    """Everything the loop produced, in order."""

    dataset_names: list[str]
    domain_names: list[str]
    targets: tuple[int, ...]
    constraints: tuple[int, ...]
    evaluations: list[EvaluationRecord] = field(default_factory=list)
    updates: list[UpdateRecord] = field(default_factory=list)
    backtracks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def kept_evaluations(self) -> list[EvaluationRecord]:
        """The main evaluations of the states the run kept (not those it backtracked from)."""
        return [e for e in self.evaluations if not e.backtracked]


@dataclass
class LoopCallbacks:
    """Side concerns (files, progress bars, trackers) hook in here, never in the logic."""

    on_evaluation: Callable[[EvaluationRecord, RunHistory], None] | None = None
    on_update: Callable[[UpdateRecord, RunHistory], None] | None = None
    on_train: Callable[[int, int], None] | None = None  # (steps just trained, step now)
    on_checkpoint: Callable[[LoopState], None] | None = None  # at a resume point
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


@dataclass
class LoopState:
    """What the loop needs to go on from a resume point: right after the evaluation, update
    and callbacks of step ``step``, before training on from it. The learner's own state is
    saved and restored by its owner (the engine) at the same point.

    ``last_update`` indexes ``history.updates`` (None before the first update);
    ``reference_losses`` are the probe-batch references, NaN for non-constraints.
    """

    event_index: int
    step: int
    reference_losses: np.ndarray
    margins: np.ndarray
    weights: np.ndarray
    last_update: int | None
    history: RunHistory
    policy_state: dict[str, Any]
    feasible: FeasibleState | None


def _unscheduled_update(schedule: UpdateSchedule, step: int) -> tuple[int, int]:
    """Horizon and probe budget of an update at ``step`` outside the schedule: it runs to
    the next scheduled update and probes no longer than the update in force there did."""
    later = [s for s in schedule.steps if s > step]
    horizon = (later[0] if later else schedule.total_steps) - step
    in_force = max(s for s in schedule.steps if s <= step)
    return horizon, min(horizon, schedule.probe_budget(in_force))


def loop_events(total_steps: int, eval_interval: int, schedule: UpdateSchedule, checkpoint_steps: Collection[int]) -> list[int]:
    """The steps the loop stops at: main evaluations, updates and resume points."""
    checkpoints = {s for s in checkpoint_steps if 0 < s < total_steps}
    return sorted(set(evaluation_steps(total_steps, eval_interval)) | set(schedule.steps) | checkpoints)


@dataclass(frozen=True)
class TrainRequest:
    """What :func:`mixture_training` asks its driver to do next: ``steps`` optimizer steps
    on mixture ``weights``, which bring the run to step ``until``."""

    steps: int
    weights: np.ndarray
    until: int


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
    checkpoint_steps: Collection[int] = (),
    resume: LoopState | None = None,
) -> RunHistory:
    """Train for ``policy.schedule.total_steps`` steps, updating weights on schedule: the
    loop of :func:`mixture_training`, with ``learner.train`` taking the steps it asks for."""
    callbacks = callbacks or LoopCallbacks()
    loop = mixture_training(
        learner,
        policy,
        targets=targets,
        constraints=constraints,
        eval_interval=eval_interval,
        reduced_batches=reduced_batches,
        callbacks=callbacks,
        max_backtracks=max_backtracks,
        checkpoint_steps=checkpoint_steps,
        resume=resume,
    )
    try:
        request = next(loop)
        while True:
            learner.train(request.steps, request.weights)
            if callbacks.on_train is not None:
                callbacks.on_train(request.steps, request.until)
            request = next(loop)
    except StopIteration as finished:
        return finished.value


def mixture_training(
    learner: Learner,
    policy: MixturePolicy,
    *,
    targets: Sequence[int],
    constraints: Sequence[int],
    eval_interval: int,
    reduced_batches: int,
    callbacks: LoopCallbacks | None = None,
    max_backtracks: int = 0,
    checkpoint_steps: Collection[int] = (),
    resume: LoopState | None = None,
) -> Generator[TrainRequest, None, RunHistory]:
    """Algorithm 2 as a generator: it evaluates, probes and solves through ``learner``, and
    yields a :class:`TrainRequest` wherever the main run must train; the driver trains
    those steps (``learner.train`` in :func:`run_mixture_training`, the user's Trainer in
    :class:`dynamics.integrations.DynamicsCallback`) and resumes it with ``next``. It
    returns the :class:`RunHistory` after the final evaluation. ``callbacks.on_train`` is
    the driver's to call.

    ``reduced_batches`` is R, the number of evaluation batches per domain a probe uses;
    the main evaluation uses all of the learner's batches.

    ``max_backtracks`` > 0 turns on backtracking, an option beyond the paper (which leaves
    it to future work): when a main evaluation shows a constraint above its reference on
    the eval split, the learner returns to the last main evaluation that kept every
    constraint (parameters, optimizer, scheduler, RNG and data positions, as in a probe),
    each broken constraint's reference is lowered by the violation just seen for the rest
    of the run (a margin learned from the miss), and the policy decides again there. The
    abandoned evaluation stays in the history marked ``backtracked``, the abandoned
    updates carry ``extra["abandoned"]``, and the new update ``extra["backtrack"]``.

    At every step of ``checkpoint_steps`` the loop hands ``callbacks.on_checkpoint`` a
    :class:`LoopState`; passing one back as ``resume`` (with the learner and the policy's
    state restored to that point) continues the run exactly where it stood. The steps
    split training stretches, so a run resumed or not takes the same steps in the same
    calls.
    """
    schedule = policy.schedule
    total_steps = schedule.total_steps
    if eval_interval < 1:
        raise ValueError(f"eval_interval must be a positive number of steps, got {eval_interval}")
    if reduced_batches < 1:
        raise ValueError(f"reduced_batches must be >= 1, got {reduced_batches}")
    if max_backtracks < 0:
        raise ValueError(f"max_backtracks must be >= 0, got {max_backtracks}")
    if not schedule.steps or schedule.steps[0] != 0:
        raise ValueError("the policy's schedule must start at step 0")
    callbacks = callbacks or LoopCallbacks()
    eval_steps = evaluation_steps(total_steps, eval_interval)
    events = loop_events(total_steps, eval_interval, schedule, checkpoint_steps)

    history = RunHistory(
        dataset_names=list(learner.dataset_names),
        domain_names=list(learner.domain_names),
        targets=tuple(targets),
        constraints=tuple(constraints),
    )
    reference_losses: np.ndarray | None = None
    margins = np.zeros(len(history.domain_names))
    weights: np.ndarray | None = None
    last_update: UpdateRecord | None = None  # the latest update not abandoned by a backtrack
    feasible_state: FeasibleState | None = None
    backtrack: dict[str, Any] | None = None  # set while re-deciding at a restored state
    index = 0
    resuming = resume is not None
    if resume is not None:
        if events[resume.event_index] != resume.step:
            raise ValueError(
                f"the saved state stands at step {resume.step}, which is not the loop's event "
                f"{resume.event_index}: the schedule, evaluation interval or checkpoint interval changed"
            )
        history = resume.history
        reference_losses = resume.reference_losses.copy()
        margins = resume.margins.copy()
        weights = resume.weights.copy()
        last_update = None if resume.last_update is None else history.updates[resume.last_update]
        feasible_state = resume.feasible
        policy.load_state_dict(resume.policy_state)
        index = resume.event_index
    while True:
        step = events[index]
        main_eval: Evaluation | None = None
        if resuming:
            pass  # this step's evaluation, update and callbacks happened before the save
        elif backtrack is not None:
            assert feasible_state is not None
            main_eval = feasible_state.evaluation  # recorded already, before the backtrack
        elif step in eval_steps:
            callbacks.phase("evaluation", step)
            started = time.perf_counter()
            main_eval = learner.evaluate("eval")
            test_eval = learner.evaluate("test")
            if main_eval.num_batches < reduced_batches:
                raise ValueError(
                    f"the main evaluation has {main_eval.num_batches} batches per domain, fewer than "
                    f"the {reduced_batches} reduced batches the probes use: lower reduced_batches"
                )
            if reference_losses is None:
                # Reference values L_i^ref = L_i(theta_0) on the probe's batches (docs/method.md).
                reference_losses = np.full(len(history.domain_names), np.nan)
                idx = list(history.constraints)
                reference_losses[idx] = main_eval.means(reduced_batches)[idx]
            record = EvaluationRecord(
                step=step,
                eval=main_eval.means(),
                test=test_eval.means(),
                weights=np.array([]) if weights is None else weights.copy(),
                wall_seconds=time.perf_counter() - started,
            )
            history.evaluations.append(record)
            if max_backtracks:
                slack = constraint_slack(record, history.evaluations[0], history.constraints)
                if (slack >= -TIE_TOLERANCE).all():
                    feasible_state = FeasibleState(index, step, main_eval, learner.snapshot(), len(history.updates))
                elif feasible_state is not None and len(history.backtracks) < max_backtracks:
                    record.backtracked = True
                    if callbacks.on_evaluation is not None:
                        callbacks.on_evaluation(record, history)
                    broken = {
                        history.domain_names[k]: float(-s)
                        for k, s in zip(history.constraints, slack, strict=True)
                        if s < -TIE_TOLERANCE
                    }
                    for k, s in zip(history.constraints, slack, strict=True):
                        margins[k] += max(0.0, float(-s))
                    for update in history.updates[feasible_state.num_updates :]:
                        update.extra["abandoned"] = True
                    live = [u for u in history.updates if not u.extra.get("abandoned")]
                    last_update = live[-1] if live else None
                    if last_update is not None and last_update.step + last_update.horizon > feasible_state.step:
                        last_update.realized_losses = None  # reached only on the abandoned branch
                    backtrack = {
                        "from_step": step,
                        "to_step": feasible_state.step,
                        "violations": broken,
                        "margins": {history.domain_names[k]: float(margins[k]) for k in history.constraints},
                        "retrained_steps": step - feasible_state.step,
                    }
                    history.backtracks.append(backtrack)
                    learner.restore(feasible_state.snapshot)
                    index = feasible_state.event_index
                    continue

        if not resuming and (step in schedule or backtrack is not None):
            callbacks.phase("update", step)
            recycled = main_eval is not None
            anchor = (
                Evaluation(main_eval.per_batch[:, :reduced_batches])
                if main_eval is not None
                else learner.evaluate("eval", reduced_batches)
            )
            if last_update is not None and last_update.step + last_update.horizon == step:
                # Realized at the end of its horizon; an update cut short by a backtrack
                # keeps no realized losses.
                last_update.realized_losses = anchor.means()
            assert reference_losses is not None  # step 0 is always evaluated first
            horizon, probe_budget = (
                (schedule.horizon(step), schedule.probe_budget(step))
                if step in schedule
                else _unscheduled_update(schedule, step)
            )
            context = UpdateContext(
                step=step,
                horizon=horizon,
                probe_budget=probe_budget,
                anchor=anchor,
                recycled_anchor=recycled,
                reference_losses=reference_losses - margins,
                targets=history.targets,
                constraints=history.constraints,
                reduced_batches=reduced_batches,
                domain_kinds=tuple(learner.domain_kinds),
                weights_in_force=None if last_update is None else np.asarray(last_update.weights, dtype=float),
                after_backtrack=backtrack is not None,
            )
            update = policy.decide(learner, context)
            if backtrack is not None:
                update.extra["backtrack"] = backtrack
            elif margins.any():
                update.extra["margins"] = {history.domain_names[k]: float(margins[k]) for k in history.constraints}
            weights = np.asarray(update.weights, dtype=float)
            history.updates.append(update)
            last_update = update
            if callbacks.on_update is not None:
                callbacks.on_update(update, history)

        if main_eval is not None and backtrack is None:
            # Weights in force from this step on (known only after a same-step update).
            history.evaluations[-1].weights = np.array([]) if weights is None else weights.copy()
            if callbacks.on_evaluation is not None:
                callbacks.on_evaluation(history.evaluations[-1], history)
        backtrack = None

        if step == total_steps:
            # The final evaluation closes the last update's horizon.
            if last_update is not None and main_eval is not None:
                last_update.realized_losses = main_eval.means(reduced_batches)
            break
        assert weights is not None and reference_losses is not None  # step 0 updates and evaluates
        if step in checkpoint_steps and not resuming and callbacks.on_checkpoint is not None:
            callbacks.on_checkpoint(
                LoopState(
                    event_index=index,
                    step=step,
                    reference_losses=reference_losses.copy(),
                    margins=margins.copy(),
                    weights=weights.copy(),
                    last_update=None
                    if last_update is None
                    else next(i for i, u in enumerate(history.updates) if u is last_update),
                    history=history,
                    policy_state=policy.state_dict(),
                    feasible=feasible_state,
                )
            )
        resuming = False
        callbacks.phase("training", step)
        yield TrainRequest(events[index + 1] - step, weights.copy(), events[index + 1])
        index += 1
    return history

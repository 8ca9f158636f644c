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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from dynamics.core.learner import Evaluation, Learner
from dynamics.core.records import EvaluationRecord, UpdateRecord
from dynamics.core.schedules import UpdateSchedule


@dataclass(frozen=True)
class UpdateContext:
    """What a policy sees at update step ``step``.

    anchor:            reduced evaluation at theta_t, shape (M, R) per batch.
    reference_losses:  step-0 values on the same R batches, NaN for non-constraints
                       (DESIGN.md §7: the solver's references use the probe's batches).
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


@dataclass
class RunHistory:
    """Everything the loop produced, in order."""

    dataset_names: list[str]
    domain_names: list[str]
    targets: tuple[int, ...]
    constraints: tuple[int, ...]
    evaluations: list[EvaluationRecord] = field(default_factory=list)
    updates: list[UpdateRecord] = field(default_factory=list)


@dataclass
class LoopCallbacks:
    """Side concerns (files, progress bars, trackers) hook in here, never in the logic."""

    on_evaluation: Callable[[EvaluationRecord, RunHistory], None] | None = None
    on_update: Callable[[UpdateRecord, RunHistory], None] | None = None
    on_train: Callable[[int, int], None] | None = None  # (steps just trained, step now)


def evaluation_steps(total_steps: int, eval_interval: int) -> list[int]:
    """Main evaluations: step 0, every ``eval_interval`` steps, and the final step."""
    steps = list(range(0, total_steps + 1, eval_interval))
    if steps[-1] != total_steps:
        steps.append(total_steps)
    return steps


def run_mixture_training(
    learner: Learner,
    policy: MixturePolicy,
    *,
    targets: Sequence[int],
    constraints: Sequence[int],
    eval_interval: int,
    reduced_batches: int,
    callbacks: LoopCallbacks | None = None,
) -> RunHistory:
    """Train for ``policy.schedule.total_steps`` steps, updating weights on schedule.

    ``reduced_batches`` is R, the number of evaluation batches per domain a probe uses;
    the main evaluation uses all of the learner's batches.
    """
    schedule = policy.schedule
    total_steps = schedule.total_steps
    if eval_interval < 1:
        raise ValueError(f"eval_interval must be a positive number of steps, got {eval_interval}")
    if reduced_batches < 1:
        raise ValueError(f"reduced_batches must be >= 1, got {reduced_batches}")
    if not schedule.steps or schedule.steps[0] != 0:
        raise ValueError("the policy's schedule must start at step 0")
    callbacks = callbacks or LoopCallbacks()
    history = RunHistory(
        dataset_names=list(learner.dataset_names),
        domain_names=list(learner.domain_names),
        targets=tuple(targets),
        constraints=tuple(constraints),
    )
    eval_steps = evaluation_steps(total_steps, eval_interval)
    events = sorted(set(eval_steps) | set(schedule.steps))

    reference_losses: np.ndarray | None = None
    weights: np.ndarray | None = None
    for index, step in enumerate(events):
        main_eval: Evaluation | None = None
        if step in eval_steps:
            started = time.perf_counter()
            main_eval = learner.evaluate("eval")
            test_eval = learner.evaluate("test")
            if main_eval.num_batches < reduced_batches:
                raise ValueError(
                    f"the main evaluation has {main_eval.num_batches} batches per domain, fewer than "
                    f"the {reduced_batches} reduced batches the probes use: lower reduced_batches"
                )
            if reference_losses is None:
                # Reference values L_i^ref = L_i(theta_0) on the probe's batches (DESIGN.md §7).
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

        if step in schedule:
            recycled = main_eval is not None
            anchor = (
                Evaluation(main_eval.per_batch[:, :reduced_batches])
                if main_eval is not None
                else learner.evaluate("eval", reduced_batches)
            )
            if history.updates:
                history.updates[-1].realized_losses = anchor.means()
            assert reference_losses is not None  # step 0 is always evaluated first
            context = UpdateContext(
                step=step,
                horizon=schedule.horizon(step),
                probe_budget=schedule.probe_budget(step),
                anchor=anchor,
                recycled_anchor=recycled,
                reference_losses=reference_losses,
                targets=history.targets,
                constraints=history.constraints,
                reduced_batches=reduced_batches,
            )
            update = policy.decide(learner, context)
            weights = np.asarray(update.weights, dtype=float)
            history.updates.append(update)
            if callbacks.on_update is not None:
                callbacks.on_update(update, history)

        if main_eval is not None:
            # Weights in force from this step on (known only after a same-step update).
            history.evaluations[-1].weights = np.array([]) if weights is None else weights.copy()
            if callbacks.on_evaluation is not None:
                callbacks.on_evaluation(history.evaluations[-1], history)

        if step == total_steps:
            # The final evaluation closes the last update's horizon.
            if history.updates and main_eval is not None:
                history.updates[-1].realized_losses = main_eval.means(reduced_batches)
            break
        assert weights is not None  # step 0 is always an update step
        steps_to_train = events[index + 1] - step
        learner.train(steps_to_train, weights)
        if callbacks.on_train is not None:
            callbacks.on_train(steps_to_train, events[index + 1])
    return history

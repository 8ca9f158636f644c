"""The engine's side of the run folder both drivers write (the files themselves are
:class:`dynamics.runs.writer.RunFolder`'s): the progress bar and trackers, the learner's
state gathered for a resume point and the model for the best checkpoint, and the summary's
metrics at the end. Only rank 0 writes; under several processes the other ranks take part
in gathering what it writes (:class:`ShardedSaves`): each rank's RNG state for a resume
point, and under sharding the whole tensors.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
from accelerate.utils import gather_object
from tqdm.auto import tqdm

from dynamics.core import metrics
from dynamics.core.controller import LoopCallbacks, MixtureController, evaluation_steps
from dynamics.core.cost import CostModel, recorded_relative_cost
from dynamics.core.records import (
    CheckpointRecord,
    EvaluationLine,
    EvaluationRecord,
    RunHistory,
    UpdateRecord,
)
from dynamics.engine import tracking
from dynamics.engine.components import RunComponents
from dynamics.engine.learner import HFLearner, TrainingSnapshot, save_snapshot
from dynamics.engine.training_state import RNGState, save_rng_state
from dynamics.runs import rundir
from dynamics.runs import state as run_state
from dynamics.runs.writer import BestCheckpoint, RunFolder, evaluation_line


class ShardedSaves:
    """Under several processes, the other ranks' side of rank 0's saves: every rank takes part
    in gathering each rank's RNG state for each resume point and, under sharding (FSDP2), the
    whole model for each new best checkpoint and the whole training state for each resume
    point, which rank 0's :class:`RunFolderWriter` then writes."""

    def __init__(self, parts: RunComponents) -> None:
        self.parts = parts
        self.best = BestCheckpoint(parts.config.evaluation.selection_margin)

    def callbacks(self) -> LoopCallbacks:
        return LoopCallbacks(on_evaluation=self.on_evaluation, on_checkpoint=self.on_checkpoint)

    def resume(self, history: RunHistory) -> None:
        for record in history.evaluations:
            self.best.update(record, history)

    def on_evaluation(self, record: EvaluationRecord, history: RunHistory) -> None:
        if self.best.update(record, history):
            self.parts.learner.gathered_model_state()

    def on_checkpoint(self, controller: MixtureController) -> None:
        gathered_training_state(self.parts.learner, controller)


@dataclasses.dataclass(frozen=True)
class ResumeState:
    """What a resume point stores of the training state: the learner's and the controller's
    feasible snapshot (rank 0's, shards gathered), and under several processes every rank's
    RNG state in each of the two (``rank_rngs[r]``: rank r's learner and feasible RNG), on
    rank 0."""

    learner: TrainingSnapshot
    feasible: TrainingSnapshot | None
    rank_rngs: list[tuple[RNGState, RNGState | None]] | None = None


def gathered_training_state(learner: HFLearner, controller: MixtureController) -> ResumeState:
    """The learner's state and the controller's feasible snapshot, as a resume point stores
    them: shards gathered, and each rank's RNG states gathered to rank 0. Under several
    processes every rank calls this, at the same point."""
    feasible = controller.feasible_snapshot
    snapshot = learner.snapshot()
    whole = learner.gathered(snapshot)
    whole_feasible = None if feasible is None else learner.gathered(feasible)
    accelerator = learner.accelerator
    rank_rngs = None
    if accelerator.num_processes > 1:
        rngs = gather_object([(snapshot.rng, None if feasible is None else feasible.rng)])
        rank_rngs = rngs if accelerator.is_main_process else None
    return ResumeState(whole, whole_feasible, rank_rngs)


class RunFolderWriter:
    """The run folder of either driver (:class:`RunFolder` writes its files), and its
    progress bar (rank 0 only): the logs as the loop goes, the best checkpoint, resume
    points, and the summary at the end.

    ``resume_how`` is the command that continues the run, said when a full disk stops it.
    """

    def __init__(self, parts: RunComponents, out: Path, progress: bool, resume_how: str) -> None:
        self.parts = parts
        self.out = out
        self.folder = RunFolder(out, resume_how, parts.config.evaluation.selection_margin)
        self.loss = float("nan")
        self.train_started = time.perf_counter()
        self.train_seconds_before = 0.0  # training time of the sessions before a resume
        self.resumed_at: list[int] = []  # the steps this run was resumed from
        self.bar = tqdm(
            total=parts.config.training.total_steps,
            desc=f"{parts.policy.name}",
            unit="step",
            disable=not progress,
            dynamic_ncols=True,
        )

    def callbacks(self) -> LoopCallbacks:
        """The loop's callbacks that keep the folder and the bar up to date (``dynamics
        run``'s; the Trainer callback uses the evaluation and update ones)."""
        return LoopCallbacks(
            self.on_evaluation, self.on_update, self.on_train, self.on_checkpoint, self.on_phase
        )

    def train_seconds(self) -> float:
        """Training wall time so far, without model and data setup, summed over the
        sessions before a resume: what the cost model's multiples compare."""
        return self.train_seconds_before + time.perf_counter() - self.train_started

    def on_update(self, update: UpdateRecord, history: RunHistory) -> None:
        self.folder.write_updates(history)
        self.parts.accelerator.log(
            tracking.update_values(update, history.dataset_names), step=update.step
        )
        self.bar.set_postfix_str(self._postfix(update.weights, history), refresh=False)

    def on_phase(self, phase: str, step: int) -> None:
        """Show what the run is doing now: training, a main evaluation, or an update (the
        probes and the solver; no probes under a fixed mixture)."""
        policy = self.parts.policy.name
        doing = {"update": "probing + solving" if policy != "fixed" else "update"}.get(phase, phase)
        self.bar.set_description_str(f"{policy} · {doing}")

    def on_evaluation(self, record: EvaluationRecord, history: RunHistory) -> None:
        best = self.folder.write_evaluation(record, history)
        line = self.metrics_row(record, history)
        self.parts.accelerator.log(tracking.evaluation_values(line), step=record.step)
        if best:
            self._save_checkpoint(record.step)
        if self.parts.config.training.total_steps and record.weights.size:
            self.bar.set_postfix_str(self._postfix(record.weights, history), refresh=False)

    def metrics_row(self, record: EvaluationRecord, history: RunHistory) -> EvaluationLine:
        """The ``metrics.jsonl`` line of one main evaluation (also what trackers are shown)."""
        return evaluation_line(record, history)

    def resume(
        self, history: RunHistory, step: int, saved: dict[str, Any], resume_point: Path
    ) -> None:
        """Go on from a resume point of ``step`` (``saved`` its loop file): the training time
        so far (every rank), and the files (rank 0): the logs rewritten as they stood there (a
        crash may have left rows of steps about to be trained again), its best checkpoint put
        back."""
        self.train_seconds_before = float(saved["train_seconds"])
        self.resumed_at = [*saved.get("resumed_at", []), step]
        if not self.parts.accelerator.is_main_process:
            return  # the files are rank 0's
        self.folder.restore(history, resume_point)
        self.bar.update(step)

    def on_checkpoint(self, controller: MixtureController) -> None:
        """``dynamics run``'s resume point: the controller's state, the learner's (shards
        gathered), and the best checkpoint, in ``last_checkpoint/``."""
        state = gathered_training_state(self.parts.learner, controller)
        self.save_resume_point(
            controller.state_dict(),
            self.out,
            run_state.RESUME_DIR,
            learner_state=state.learner,
            feasible_state=state.feasible,
            rank_rngs=state.rank_rngs,
        )

    def save_resume_point(
        self,
        loop: dict[str, Any],
        root: Path,
        name: str,
        *,
        learner_state: TrainingSnapshot | None = None,
        feasible_state: TrainingSnapshot | None = None,
        rank_rngs: list[tuple[RNGState, RNGState | None]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Write the resume point ``root/name`` of the controller state ``loop``: its loop file
        (with the training time so far, the number of processes, and the driver's ``extra``
        entries), the config, the learner's training state and feasible snapshot when given
        (a Trainer's checkpoint holds the model and optimizer itself), each rank's RNG states
        in ``rng/`` when given (``rank_rngs``, under several processes), and a copy of the
        best checkpoint."""
        loop_file = {
            "loop": loop,
            "train_seconds": self.train_seconds(),
            "resumed_at": self.resumed_at,
            "processes": self.parts.accelerator.num_processes,
            **(extra or {}),
        }

        def write_state(folder: Path) -> None:
            if learner_state is not None:
                save_snapshot(learner_state, folder, "learner")
            if feasible_state is not None:
                save_snapshot(feasible_state, folder, "feasible")
            if rank_rngs is not None:
                _save_rank_rngs(rank_rngs, folder / run_state.RNG_DIR)

        self.folder.write_resume_point(
            root, name, loop_file, self.parts.config.to_yaml(), write_state
        )

    def finish(
        self, history: RunHistory, wall_seconds: float, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The summary (every rank computes it), written with the final controller log and
        the best checkpoint's model card by rank 0; ``extra`` adds the driver's own entries."""
        self.bar.close()
        summary = summarize(self.parts, history, wall_seconds)
        summary["train_seconds"] = self.train_seconds()
        summary["resumed_at"] = self.resumed_at
        summary["skipped_steps"] = self.parts.learner.skipped_steps
        summary.update(extra or {})
        if self.parts.accelerator.is_main_process:
            self.folder.write_summary(summary, history)
        return summary

    def on_train(self, steps: int, step_now: int) -> None:
        # The bar counts steps trained: after a return to an earlier state (backtracking)
        # the steps trained again are added to its total, so it still ends full.
        retrained = self.bar.n + steps - step_now
        if retrained > 0:
            self.bar.total = self.parts.config.training.total_steps + retrained
        self.bar.update(steps)
        learner = self.parts.learner
        self.loss = learner.last_train_loss
        self.parts.accelerator.log(
            tracking.training_values(self.loss, float(learner.lr_scheduler.get_last_lr()[0])),
            step=step_now,
        )

    def _postfix(self, weights: np.ndarray, history: RunHistory) -> str:
        parts = [f"loss={self.loss:.3f}", f"w=[{', '.join(f'{w:.2f}' for w in weights)}]"]
        if history.evaluations:
            last = history.evaluations[-1]
            parts.append(f"target={last.eval[list(history.targets)].sum():.3f}")
            if history.constraints:
                slack = metrics.constraint_slack(last, history.evaluations[0], history.constraints)
                parts.append(f"worst slack={slack.min():+.3f}")
        return " ".join(parts)

    def _save_checkpoint(self, step: int) -> None:
        model = self.parts.accelerator.unwrap_model(self.parts.model)
        # Under sharding, gathered from every rank (a state dict of shards would save parts).
        whole = self.parts.learner.gathered_model_state()

        def write_model(folder: Path) -> None:
            # PEFT models save only the adapter (adapter_model.safetensors +
            # adapter_config.json); full fine-tuning saves model.safetensors. No state dict
            # (unsharded): the model's own.
            model.save_pretrained(folder, state_dict=whole)
            self.parts.tokenizer.save_pretrained(folder)

        self.folder.write_best_checkpoint(step, write_model)


def _save_rank_rngs(rank_rngs: list[tuple[RNGState, RNGState | None]], folder: Path) -> None:
    """Each rank's learner and feasible RNG states, in ``rng/`` of a resume point."""
    folder.mkdir()
    for rank, (learner_rng, feasible_rng) in enumerate(rank_rngs):
        save_rng_state(learner_rng, folder, run_state.rank_rng_name("learner", rank))
        if feasible_rng is not None:
            save_rng_state(feasible_rng, folder, run_state.rank_rng_name("feasible", rank))


def summarize(parts: RunComponents, history: RunHistory, wall_seconds: float) -> dict[str, Any]:
    """summary.json: the paper's metrics on this run, plus cost and prediction error.

    ``predicted_cost`` is the run's compute as a multiple of one fixed-mixture run with the
    same settings, counted in forward passes from what the run recorded
    (:func:`dynamics.core.cost.recorded_relative_cost`: training, main evaluations on both
    splits, probes or alignment gradients, reduced evaluations, retrained steps), with one
    training step assumed to cost ``cost_assumption``'s forward passes. ``train_seconds``
    is the measured training wall time (setup excluded), summed over resumed sessions.
    """
    points = history.kept_evaluations
    targets, constraints = history.targets, history.constraints
    margin = parts.config.evaluation.selection_margin
    best = metrics.best_feasible_checkpoint(points, targets, constraints, margin)
    feasible = best is not None
    closest = (
        metrics.max_violation_closest_to_feasibility(points, constraints)
        if constraints and len(points) > 1
        else None
    )
    config = parts.config
    schedule = parts.policy.schedule
    cost, cost_model = _predicted_cost(parts, history)
    errors = [u.prediction_error for u in history.updates if u.prediction_error is not None]
    return {
        "method": config.method.name,
        "policy": parts.policy.name,
        "dataset_names": history.dataset_names,
        "domain_names": history.domain_names,
        "domain_metrics": parts.domain_metrics,
        "metric_convention": "lower is better: losses in nats, accuracy stored as -accuracy",
        "targets": list(targets),
        "constraints": list(constraints),
        "total_steps": schedule.total_steps,
        "feasible": feasible,
        "best_checkpoint": None
        if best is None
        else CheckpointRecord(
            step=best.step,
            eval=rundir.named(best.eval, history.domain_names),
            test=rundir.named(best.test, history.domain_names),
            path=rundir.CHECKPOINT_DIR,
        ).to_dict(),
        "selection_margin": margin,
        "constrained_ppl_reduction": metrics.constrained_perplexity_reduction(
            points, targets, constraints, margin
        ),
        "closest_to_feasible": None
        if closest is None
        else {"step": closest[0], "max_violation": closest[1]},
        "num_updates": len(history.updates),
        "backtracks": history.backtracks,
        "probe_seconds": float(sum(u.probe_seconds for u in history.updates)),
        "wall_seconds": wall_seconds,
        "predicted_cost": cost,
        "cost_assumption": f"one training step = {cost_model.train_fwd_ratio:g} forward passes; "
        "counts training, main evaluations on eval and test, probes or gradient-alignment "
        "gradients, reduced evaluations and steps retrained after a backtrack",
        "mean_abs_prediction_error": rundir.named(
            np.abs(np.array(errors)).mean(axis=0), history.domain_names
        )
        if errors
        else None,
    }


def _predicted_cost(parts: RunComponents, history: RunHistory) -> tuple[float, CostModel]:
    """The run's compute as a multiple of one fixed-mixture run (``predicted_cost``), and the
    cost model it assumed."""
    config = parts.config
    schedule = parts.policy.schedule
    cost_model = dataclasses.replace(
        CostModel.for_predictor(config.method.predictor),
        eval_interval=config.evaluation.interval,
        main_eval_batches=config.evaluation.batches,
        reduced_eval_batches=config.evaluation.reduced_batches,
    )
    cost = recorded_relative_cost(
        history.updates,
        n_datasets=len(history.dataset_names),
        n_domains=len(history.domain_names),
        total_steps=schedule.total_steps,
        trained_steps=schedule.total_steps + sum(b["retrained_steps"] for b in history.backtracks),
        evaluations=len(history.evaluations),
        plain_evaluations=len(evaluation_steps(schedule.total_steps, config.evaluation.interval)),
        test_eval_batches=config.evaluation.batches,
        model=cost_model,
        alignment_batches=config.method.alignment_batches
        if config.method.name == "gradient-alignment"
        else None,
    )
    return cost, cost_model

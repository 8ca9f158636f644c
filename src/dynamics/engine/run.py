"""One fine-tuning run from a config: build, train with the configured mixture policy,
write the run folder (docs/method.md, "The run folder"). The recipe reads top to bottom:

    setup  -> tokenizer, model (+LoRA), data, evaluation batches, learner, policy
    train  -> ``core.controller.run_mixture_training`` with file/progress callbacks
    finish -> summary.json with the paper's metrics and the cost model's prediction

Under several processes (``torchrun`` / ``accelerate launch``) every rank builds the same
data (the first process of each machine tokenizes into datasets' cache, the others read
it); each optimizer step draws one global batch from one dataset and every rank trains
on its own slice of it; the fixed evaluation batches are shared out among the ranks
(batch b to rank b mod P) and the per-batch values gathered; the policy decides
on every rank (probes are collective training) and rank 0's decision is broadcast, so
all ranks hold identical weights and slopes. Only rank 0 writes files. A refusal that one
rank finds while the run starts (the output folder, the data, a damaged resume point)
reaches every rank (:func:`agree_on_refusal`), so no rank is left waiting for the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import datasets
import numpy as np
import torch
import transformers
import yaml
from accelerate import Accelerator, PartialState
from accelerate.utils import broadcast_object_list, gather_object, set_seed
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dynamics.core import metrics
from dynamics.core.controller import (
    LoopCallbacks,
    LoopState,
    MixturePolicy,
    RunHistory,
    UpdateContext,
    evaluation_steps,
    run_mixture_training,
)
from dynamics.core.cost import CostModel, recorded_relative_cost
from dynamics.core.learner import Learner
from dynamics.core.policies import DynamicsPolicy, FixedWeightsPolicy, GradientAlignmentPolicy
from dynamics.core.problem import SolverGrid
from dynamics.core.records import EvaluationRecord, UpdateRecord
from dynamics.core.schedules import UpdateSchedule, build_schedule
from dynamics.data.formatting import LMExample, pad_token_id
from dynamics.data.loading import DataError
from dynamics.data.splits import prepare_examples
from dynamics.engine import tracking
from dynamics.engine.batches import Batch, EvalBatches
from dynamics.engine.config import RunConfig
from dynamics.engine.learner import HFLearner, TrainingSnapshot, load_snapshot, save_snapshot
from dynamics.engine.model import load_causal_lm, load_tokenizer, prepare_model
from dynamics.engine.preflight import RunSetupError, preflight
from dynamics.engine.sampler import DatasetStream, MixtureSampler
from dynamics.runs import rundir
from dynamics.runs import state as run_state

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Bad input found while a run starts: one line for the user (the CLI's exit code 2).
REFUSALS = (RunSetupError, rundir.RunDirError, DataError)


def _world_size() -> int:
    # Before the Accelerator exists: torchrun / accelerate set WORLD_SIZE for every process.
    return int(os.environ.get("WORLD_SIZE", "1"))


def agree_on_refusal(error: Exception | None) -> None:
    """Stop every rank when any rank stopped: each rank's outcome of a setup step (``error``
    None when it succeeded) is gathered from all ranks; a rank that failed raises its own
    error, the others raise the first failed rank's (a refusal as the same one line). Every
    rank must call this at the same point; under one process it just raises ``error``."""
    if _world_size() == 1:
        if error is not None:
            raise error
        return
    # Joins the process group (set up as build_run's Accelerator sets it up, which then reuses it).
    PartialState(cpu=not torch.cuda.is_available())
    outcome = None if error is None else (isinstance(error, REFUSALS), str(error))
    outcomes = gather_object([outcome])
    if error is not None:
        raise error
    for rank, other in enumerate(outcomes):
        if other is not None:
            refused, message = other
            if refused:
                raise RunSetupError(message)
            raise RuntimeError(f"process {rank} stopped while the run was starting: {message}")


def _attempt(step: Callable[[], T]) -> tuple[T | None, Exception | None]:
    try:
        return step(), None
    except Exception as err:  # handed to agree_on_refusal, which raises it again
        return None, err


class RankSlicedSampler:
    """Each optimizer step draws one *global* batch (from one dataset, the same on every
    rank since the choice RNG is seeded identically) and this rank keeps its rows, so the
    union over ranks is exactly the single-process batch of the same global size."""

    def __init__(self, sampler: MixtureSampler, rank: int, world_size: int) -> None:
        self.sampler = sampler
        self.rank = rank
        self.world_size = world_size

    def next_batch(self, weights: np.ndarray) -> tuple[int, Batch]:
        j, batch = self.sampler.next_batch(weights)
        return j, self._slice(batch)

    def probe_batch(self, j: int) -> Batch:
        return self._slice(self.sampler.probe_batch(j))

    def probe_slices(self, j: int) -> list[Batch]:
        """The next global probe batch of dataset ``j`` as every rank's slice, for a rank
        that probes ``j`` on its own; the stream moves as under ``probe_batch``."""
        batch = self.sampler.probe_batch(j)
        return [self._slice(batch, rank) for rank in range(self.world_size)]

    def _slice(self, batch: Batch, rank: int | None = None) -> Batch:
        if self.world_size == 1:
            return batch
        rank = self.rank if rank is None else rank
        rows = next(iter(batch.values())).shape[0] // self.world_size
        return {k: v[rank * rows : (rank + 1) * rows] for k, v in batch.items()}

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


@dataclass
class BroadcastPolicy:
    """Run the wrapped policy on every rank (each rank probing its share of the datasets,
    or all of them together; see ``HFLearner.probe_all``), then adopt rank 0's record
    everywhere: one decision, identical weights and slopes on all ranks."""

    policy: MixturePolicy
    accelerator: Accelerator

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def schedule(self) -> UpdateSchedule:
        return self.policy.schedule

    def decide(self, learner: Learner, context: UpdateContext) -> UpdateRecord:
        record = self.policy.decide(learner, context)
        if self.accelerator.num_processes == 1:
            return record
        shared = [record]
        broadcast_object_list(shared, from_process=0)
        return shared[0]

    def state_dict(self) -> dict[str, Any]:
        return self.policy.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state)


@dataclass
class BuiltRun:
    """Everything set up for one run, before training."""

    config: RunConfig
    accelerator: Accelerator
    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module
    learner: HFLearner
    policy: MixturePolicy
    targets: tuple[int, ...]
    constraints: tuple[int, ...]
    domain_metrics: list[str]


def build_policy(config: RunConfig, dataset_names: list[str]) -> MixturePolicy:
    method = config.method
    total_steps = config.training.total_steps
    grid = SolverGrid(
        lambdas=tuple(method.grid.lambdas) if method.grid.lambdas else SolverGrid().lambdas,
        epsilons=tuple(method.grid.epsilons) if method.grid.epsilons is not None else SolverGrid().epsilons,
    )
    if method.name == "fixed":
        assert method.weights is not None  # validated
        weights = np.array([method.weights[name] for name in dataset_names], dtype=float)
        return FixedWeightsPolicy(weights, total_steps=total_steps, label="fixed")
    schedule = build_schedule(method.schedule, total_steps, method.probe_cap)
    if method.name == "gradient-alignment":
        return GradientAlignmentPolicy(schedule, num_batches=method.alignment_batches, grid=grid)
    return DynamicsPolicy(schedule, predictor=method.predictor, grid=grid, options=method.robust_options())


@dataclass
class RunData:
    """The tokenized data of a run: one training stream per fine-tuning dataset (in weight
    order) and the fixed evaluation batches of every target and constraint (targets first,
    in slope-matrix row order)."""

    streams: list[DatasetStream]
    dataset_names: list[str]
    domains: list[EvalBatches]
    targets: tuple[int, ...]
    constraints: tuple[int, ...]
    domain_metrics: list[str]


def build_data(
    config: RunConfig,
    tokenizer: PreTrainedTokenizerBase,
    world: int = 1,
    data: Mapping[str, datasets.Dataset] | None = None,
) -> RunData:
    """Tokenize and split every dataset of ``config`` (reading ``data[name]`` for rows passed
    in Python); ``world`` processes share each global training batch (the streams draw
    batches of ``batch_size * world`` rows)."""
    data = data or {}
    training = config.training
    pad_id = pad_token_id(tokenizer)
    eval_batch_size = config.evaluation.batch_size or training.batch_size
    streams: list[DatasetStream] = []
    domains: dict[str, EvalBatches] = {}
    for index, dataset in enumerate(config.datasets):
        parts = prepare_examples(
            dataset.data_source(data.get(dataset.name)),
            tokenizer,
            sequence_length=training.sequence_length,
            packing=training.packing,
            seed=training.data_seed + index,
        )
        if dataset.role != "constraint":
            train_examples = [e for e in parts.train if isinstance(e, LMExample)]
            if not train_examples:
                raise RunSetupError(
                    f"dataset {dataset.name!r} has no training examples left after the eval/test split: "
                    "add rows or lower its eval_size/test_size"
                )
            streams.append(
                DatasetStream(
                    train_examples,
                    batch_size=training.batch_size * world,
                    pad_id=pad_id,
                    seed=training.seed * 1000 + index,
                )
            )
        if dataset.role in ("target", "constraint"):
            domains[dataset.name] = EvalBatches.build(
                dataset.name,
                parts.eval,
                parts.test,
                num_batches=config.evaluation.batches,
                batch_size=dataset.eval_batch_size or eval_batch_size,
                pad_id=pad_id,
                seed=training.data_seed + 7919 * (index + 1),
            )

    domain_configs = config.evaluation_domains
    domain_list = [domains[d.name] for d in domain_configs]
    for d, built in zip(domain_configs, domain_list, strict=True):
        if built.metric != d.metric:
            raise RunSetupError(f"dataset {d.name!r}: metric {d.metric!r} does not fit its rows ({built.metric})")
    num_targets = sum(1 for d in domain_configs if d.role == "target")
    return RunData(
        streams=streams,
        dataset_names=[d.name for d in config.training_datasets],
        domains=domain_list,
        targets=tuple(range(num_targets)),
        constraints=tuple(range(num_targets, len(domain_configs))),
        domain_metrics=[d.metric for d in domain_configs],
    )


def build_run(
    config: RunConfig,
    accelerator: Accelerator | None = None,
    *,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    data: Mapping[str, datasets.Dataset] | None = None,
) -> BuiltRun:
    """Set up the tokenizer, model, data, learner and policy of ``config``; ``model`` and
    ``tokenizer`` (passed together) replace the config's, ``data`` holds rows by dataset name."""
    training = config.training
    if accelerator is None:
        accelerator = Accelerator(
            mixed_precision=training.mixed_precision,
            cpu=not torch.cuda.is_available(),
            gradient_accumulation_steps=1,  # the learner accumulates itself
            log_with=list(config.trackers) or None,
            project_dir=config.output_dir,
        )
    set_seed(training.seed)
    if (model is None) != (tokenizer is None):
        raise RunSetupError("pass model= and tokenizer= together (the model's own tokenizer), or neither")
    if tokenizer is None:
        tokenizer = load_tokenizer(config.model)
    base_model = model if model is not None else load_causal_lm(config.model)
    vocab = int(base_model.config.vocab_size)
    if len(tokenizer) > vocab:
        raise RunSetupError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's embedding has {vocab}: "
            "use the model's own tokenizer (model.tokenizer) or a larger vocab_size in model.init_config"
        )
    trained = prepare_model(base_model, config.lora, training.gradient_checkpointing)
    # The first process of each machine loads and tokenizes into datasets' cache; the others
    # then read the cached tokens (dynamics.data.formatting.tokenize_rows). A refusal of the
    # data found by the first reaches the others, which would otherwise wait for it forever.
    def load() -> RunData:
        return build_data(config, tokenizer, accelerator.num_processes, data)

    run_data, error = _attempt(load) if accelerator.is_local_main_process else (None, None)
    agree_on_refusal(error)
    if not accelerator.is_local_main_process:
        run_data, error = _attempt(load)
    agree_on_refusal(error)
    assert run_data is not None  # else agree_on_refusal raised
    sampler = RankSlicedSampler(
        MixtureSampler(run_data.streams, seed=training.seed), accelerator.process_index, accelerator.num_processes
    )
    learner = HFLearner(
        trained,
        sampler,
        run_data.dataset_names,
        run_data.domains,
        config.optimizer,
        total_steps=training.total_steps,
        gradient_accumulation=training.gradient_accumulation,
        accelerator=accelerator,
        max_skipped_steps=training.max_skipped_steps,
    )
    learner.split_probes = training.split_probes
    policy: MixturePolicy = BroadcastPolicy(build_policy(config, run_data.dataset_names), accelerator)
    return BuiltRun(
        config=config,
        accelerator=accelerator,
        tokenizer=tokenizer,
        model=trained,
        learner=learner,
        policy=policy,
        targets=run_data.targets,
        constraints=run_data.constraints,
        domain_metrics=run_data.domain_metrics,
    )


def is_feasible(record: EvaluationRecord, history: RunHistory) -> bool:
    """Whether a main evaluation is a feasible checkpoint (the paper's definition)."""
    reference = history.evaluations[0]
    return record.step > 0 and metrics.checkpoint_feasible(
        record, reference, history.targets, history.constraints
    )


class BestCheckpoint:
    """The best checkpoint so far: the feasible evaluation with the lowest target loss sum."""

    def __init__(self) -> None:
        self.record: EvaluationRecord | None = None

    def update(self, record: EvaluationRecord, history: RunHistory) -> bool:
        """Whether ``record`` is the new best (and then remember it)."""
        targets = list(history.targets)
        if is_feasible(record, history) and (
            self.record is None or record.eval[targets].sum() < self.record.eval[targets].sum()
        ):
            self.record = record
            return True
        return False


class ShardGathering:
    """Under sharding (FSDP2), the other ranks' side of rank 0's saves: every rank takes part
    in gathering the whole model for each new best checkpoint and the whole training state
    for each resume point, which rank 0's :class:`RunFolderWriter` then writes."""

    def __init__(self, built: BuiltRun) -> None:
        self.built = built
        self.best = BestCheckpoint()

    def callbacks(self) -> LoopCallbacks:
        return LoopCallbacks(on_evaluation=self.on_evaluation, on_checkpoint=self.on_checkpoint)

    def resume(self, state: LoopState) -> None:
        for record in state.history.evaluations:
            self.best.update(record, state.history)

    def on_evaluation(self, record: EvaluationRecord, history: RunHistory) -> None:
        if self.best.update(record, history):
            self.built.learner.whole_model_state()

    def on_checkpoint(self, state: LoopState) -> None:
        whole_training_state(self.built.learner, state)


def whole_training_state(
    learner: HFLearner, state: LoopState
) -> tuple[TrainingSnapshot, TrainingSnapshot | None]:
    """The learner's state and the loop's feasible snapshot, as a resume point stores them
    (shards gathered; every rank calls this under sharding)."""
    feasible = None if state.feasible is None else learner.whole(state.feasible.snapshot)
    return learner.whole(learner.snapshot()), feasible


class RunFolderWriter:
    """Callbacks that keep the run folder and the progress bar up to date (rank 0 only)."""

    def __init__(self, built: BuiltRun, out: Path, progress: bool) -> None:
        self.built = built
        self.out = out
        self.metrics_log = rundir.JsonlLog(out / rundir.METRICS_FILE)
        self.controller_log = rundir.JsonlLog(out / rundir.CONTROLLER_FILE)
        self.best = BestCheckpoint()
        self.loss = float("nan")
        self.train_started = time.perf_counter()
        self.train_seconds_before = 0.0  # training time of the sessions before a resume
        self.resumed_at: list[int] = []  # the steps this run was resumed from
        self.resume_how = f"dynamics run --resume {out}"  # said when a full disk stops the run
        self.bar = tqdm(
            total=built.config.training.total_steps,
            desc=f"{built.policy.name}",
            unit="step",
            disable=not progress,
            dynamic_ncols=True,
        )

    def on_update(self, update: UpdateRecord, history: RunHistory) -> None:
        self.write_updates(history)
        self.built.accelerator.log(tracking.update_values(update, history.dataset_names), step=update.step)
        self.bar.set_postfix_str(self._postfix(update.weights, history), refresh=False)

    def on_phase(self, phase: str, step: int) -> None:
        """Show what the run is doing now: training, a main evaluation, or an update (the
        probes and the solver; no probes under a fixed mixture)."""
        policy = self.built.policy.name
        doing = {"update": "probing + solving" if policy != "fixed" else "update"}.get(phase, phase)
        self.bar.set_description_str(f"{policy} · {doing}")

    @contextlib.contextmanager
    def writing(self, what: str, path: Path) -> Iterator[None]:
        """Stop the run with one line (:class:`rundir.RunStopped`) when the disk is full
        while ``what`` is written to ``path``: every write is atomic, so what was written
        before stays whole, and the last complete resume point is where the run goes on."""
        try:
            yield
        except Exception as err:
            if not rundir.out_of_space(err):
                raise
            point = run_state.choose_resume_point(self.out)
            goes_on = (
                f"it goes on from {point.path.name}/ (step {point.step})"
                if point.path is not None
                else "it has no resume point yet and starts again from step 0"
            )
            raise rundir.RunStopped(
                f"no space left on the device while writing {what} ({path}): free space there, then "
                f"continue the run with {self.resume_how} ({goes_on})"
            ) from err

    def write_updates(self, history: RunHistory) -> None:
        # The previous update's realized losses are known only now, so the whole (small)
        # file is rewritten rather than appended to.
        with self.writing(rundir.CONTROLLER_FILE, self.controller_log.path):
            self.controller_log.rewrite(
                {"dataset_names": history.dataset_names, **u.to_dict()} for u in history.updates
            )

    def on_evaluation(self, record: EvaluationRecord, history: RunHistory) -> None:
        row = self.metrics_row(record, history)
        with self.writing(rundir.METRICS_FILE, self.metrics_log.path):
            self.metrics_log.append(row)
        self.built.accelerator.log(tracking.evaluation_values(row), step=record.step)
        if self.best.update(record, history):
            self._save_checkpoint(record.step)
        if self.built.config.training.total_steps and record.weights.size:
            self.bar.set_postfix_str(self._postfix(record.weights, history), refresh=False)

    def metrics_row(self, record: EvaluationRecord, history: RunHistory) -> dict[str, Any]:
        """The ``metrics.jsonl`` row of one main evaluation (also what trackers are shown)."""
        names = history.domain_names
        reference = history.evaluations[0]
        feasible = is_feasible(record, history)
        slack = metrics.constraint_slack(record, reference, history.constraints)
        return {
            "step": record.step,
            "eval": rundir.named(record.eval, names),
            "test": rundir.named(record.test, names),
            "weights": rundir.named(record.weights, history.dataset_names) if record.weights.size else {},
            "target_loss_sum": float(record.eval[list(history.targets)].sum()),
            "constraint_slack": rundir.named(slack, [names[i] for i in history.constraints]),
            "feasible": bool(feasible),
            "backtracked": record.backtracked,
            "wall_seconds": record.wall_seconds,
        }

    def resume(self, state: LoopState, resume_point: Path) -> None:
        """Rewrite the logs as they stood at the resume point (a crash may have left rows of
        steps about to be trained again) and put its best checkpoint back."""
        history = state.history
        rows = [self.metrics_row(record, history) for record in history.evaluations]
        with self.writing(rundir.METRICS_FILE, self.metrics_log.path):
            self.metrics_log.rewrite(rows)
        for record in history.evaluations:
            self.best.update(record, history)
        self.write_updates(history)
        with self.writing("the best checkpoint", self.out / rundir.CHECKPOINT_DIR):
            run_state.restore_best_copy(self.out, resume_point)
        self.bar.update(state.step)

    def on_checkpoint(self, state: LoopState) -> None:
        """Save a resume point: the loop's state, the learner's, and the best checkpoint."""
        train_seconds = self.train_seconds_before + time.perf_counter() - self.train_started
        learner_snapshot, feasible_snapshot = whole_training_state(self.built.learner, state)

        def write(folder: Path) -> None:
            save_snapshot(learner_snapshot, folder, "learner")
            feasible = None
            if feasible_snapshot is not None:
                feasible = "feasible"
                save_snapshot(feasible_snapshot, folder, feasible)
            loop = {
                **run_state.loop_state_to_dict(state, feasible),
                "train_seconds": train_seconds,
                "resumed_at": self.resumed_at,
            }
            (folder / run_state.LOOP_FILE).write_text(json.dumps(loop, allow_nan=False))
            run_state.save_best_copy(self.out, folder)

        with self.writing(f"the resume point of step {state.step}", self.out / run_state.RESUME_DIR):
            run_state.write_resume_point(self.out, state.step, write)

    def on_train(self, steps: int, step_now: int) -> None:
        self.bar.update(steps)
        learner = self.built.learner
        self.loss = learner.last_train_loss
        self.built.accelerator.log(
            tracking.training_values(self.loss, float(learner.lr_scheduler.get_last_lr()[0])), step=step_now
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
        model = self.built.accelerator.unwrap_model(self.built.model)
        # Under sharding, gathered from every rank (a state dict of shards would save parts).
        whole = self.built.learner.whole_model_state()

        def write(folder: Path) -> None:
            # PEFT models save only the adapter (adapter_model.safetensors +
            # adapter_config.json); full fine-tuning saves model.safetensors. No state dict
            # (unsharded): the model's own.
            model.save_pretrained(folder, state_dict=whole)
            self.built.tokenizer.save_pretrained(folder)
            (folder / "step.txt").write_text(f"{step}\n")

        path = self.out / rundir.CHECKPOINT_DIR
        with self.writing(f"the best checkpoint of step {step}", path):
            rundir.atomic_write_dir(path, write)


def summarize(built: BuiltRun, history: RunHistory, wall_seconds: float) -> dict[str, Any]:
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
    best = metrics.best_feasible_checkpoint(points, targets, constraints)
    feasible = best is not None
    closest = (
        metrics.max_violation_closest_to_feasibility(points, constraints)
        if constraints and len(points) > 1
        else None
    )
    config = built.config
    schedule = built.policy.schedule
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
        alignment_batches=config.method.alignment_batches if config.method.name == "gradient-alignment" else None,
    )
    errors = [u.prediction_error for u in history.updates if u.prediction_error is not None]
    return {
        "method": config.method.name,
        "policy": built.policy.name,
        "dataset_names": history.dataset_names,
        "domain_names": history.domain_names,
        "domain_metrics": built.domain_metrics,
        "metric_convention": "lower is better: losses in nats, accuracy stored as -accuracy",
        "targets": list(targets),
        "constraints": list(constraints),
        "total_steps": schedule.total_steps,
        "feasible": feasible,
        "best_checkpoint": None
        if best is None
        else {
            "step": best.step,
            "eval": rundir.named(best.eval, history.domain_names),
            "test": rundir.named(best.test, history.domain_names),
            "path": rundir.CHECKPOINT_DIR,
        },
        "constrained_ppl_reduction": metrics.constrained_perplexity_reduction(points, targets, constraints),
        "closest_to_feasible": None if closest is None else {"step": closest[0], "max_violation": closest[1]},
        "num_updates": len(history.updates),
        "backtracks": history.backtracks,
        "probe_seconds": float(sum(u.probe_seconds for u in history.updates)),
        "wall_seconds": wall_seconds,
        "predicted_cost": cost,
        "cost_assumption": f"one training step = {cost_model.train_fwd_ratio:g} forward passes; "
        "counts training, main evaluations on eval and test, probes or gradient-alignment "
        "gradients, reduced evaluations and steps retrained after a backtrack",
        "mean_abs_prediction_error": rundir.named(np.abs(np.array(errors)).mean(axis=0), history.domain_names)
        if errors
        else None,
    }


def checkpoint_steps(config: RunConfig) -> list[int]:
    """The resume points: every ``training.checkpoint_interval`` steps (by default at every
    main evaluation; none for 0)."""
    interval = config.training.checkpoint_interval
    if interval is None:
        interval = config.evaluation.interval
    return list(range(interval, config.training.total_steps, interval)) if interval else []


def run(
    config: RunConfig,
    progress: bool = True,
    resume: bool = False,
    *,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    data: Mapping[str, datasets.Dataset] | None = None,
) -> dict[str, Any]:
    """Train ``config`` and write its run folder; returns the summary.

    With ``resume``, continue the run in ``config.output_dir`` from its last complete
    resume point (``last_checkpoint/``); the config must be the one it started with. A
    finished run is not trained again: its summary is returned as it is.

    From a notebook, ``model`` and ``tokenizer`` (together) replace the config's ``model``
    section: the model is fine-tuned in place (LoRA adapters, if ``lora`` is set, are added
    to it). ``data`` maps dataset names to ``datasets.Dataset`` rows for the datasets whose
    config gives no path or hub id. A resume must pass the same objects again.
    """
    started = time.perf_counter()
    # Our own bar shows the run's progress; the libraries' per-file bars (dataset splits,
    # weight loading, checkpoint shards) would only interleave with it.
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    accelerator_main = _is_main_process()
    out = Path(config.output_dir)
    # Checked before anything is written, so a bad request leaves no half-made run folder;
    # a refusal found by one rank (only rank 0 checks the output folder) stops every rank.
    choice, error = _attempt(lambda: _check_start(config, data, model is not None, resume, accelerator_main))
    agree_on_refusal(error)
    if resume and (out / rundir.SUMMARY_FILE).is_file():
        return dict(json.loads((out / rundir.SUMMARY_FILE).read_text()))
    resume_point = choice.path if choice is not None else None
    built = build_run(config, model=model, tokenizer=tokenizer, data=data)

    damaged = [path for path, _ in choice.damaged] if choice is not None else []

    def prepare_folder() -> None:
        if accelerator_main and resume:
            run_state.clear_unfinished(out, keep=resume_point, damaged=damaged)
        elif accelerator_main:
            # Created only once setup succeeded: a data or model error leaves no folder behind.
            rundir.prepare_run_dir(out)
            rundir.atomic_write_text(out / rundir.CONFIG_FILE, config.to_yaml())

    agree_on_refusal(_attempt(prepare_folder)[1])
    accelerator = built.accelerator
    if config.trackers:
        tracking.start_trackers(accelerator, config)
    writer = RunFolderWriter(built, out, progress and accelerator.is_main_process)
    loop_state: LoopState | None = None
    gathering = (
        ShardGathering(built) if built.learner.sharded and not accelerator.is_main_process else None
    )
    if resume_point is not None:
        point = resume_point
        built.learner.load_training_state(load_snapshot(point, "learner"))
        saved = run_state.read_loop_file(point)
        loop_state = run_state.loop_state_from_dict(
            saved, lambda name: built.learner.sharded_like(load_snapshot(point, name))
        )
        writer.train_seconds_before = float(saved["train_seconds"])
        writer.resumed_at = [*saved.get("resumed_at", []), loop_state.step]
        if accelerator.is_main_process:
            writer.resume(loop_state, point)
        elif gathering is not None:
            gathering.resume(loop_state)
    if accelerator.is_main_process:
        callbacks = LoopCallbacks(
            writer.on_evaluation, writer.on_update, writer.on_train, writer.on_checkpoint, writer.on_phase
        )
    else:
        callbacks = gathering.callbacks() if gathering is not None else LoopCallbacks()
    writer.train_started = time.perf_counter()
    history = run_mixture_training(
        built.learner,
        built.policy,
        targets=built.targets,
        constraints=built.constraints,
        eval_interval=config.evaluation.interval,
        reduced_batches=config.evaluation.reduced_batches,
        callbacks=callbacks,
        max_backtracks=config.method.backtrack,
        checkpoint_steps=checkpoint_steps(config),
        resume=loop_state,
    )
    writer.bar.close()
    summary = summarize(built, history, time.perf_counter() - started + writer.train_seconds_before)
    # Training wall time without model/data setup: what the cost model's multiples compare.
    # A resumed run adds the training time of its earlier sessions up to the resume point.
    summary["train_seconds"] = writer.train_seconds_before + time.perf_counter() - writer.train_started
    summary["resumed_at"] = writer.resumed_at
    summary["skipped_steps"] = built.learner.skipped_steps
    if accelerator.is_main_process:
        writer.write_updates(history)  # the final evaluation closed the last horizon
        with writer.writing(rundir.SUMMARY_FILE, out / rundir.SUMMARY_FILE):
            rundir.write_json(out / rundir.SUMMARY_FILE, summary)
    if config.trackers:
        accelerator.end_training()
    accelerator.wait_for_everyone()
    return summary


def _check_start(
    config: RunConfig,
    data: Mapping[str, datasets.Dataset] | None,
    model_given: bool,
    resume: bool,
    main: bool,
) -> run_state.ResumeChoice | None:
    """The refusals a run checks before its setup (raised), and for a resume the resume
    point it goes on from (None when the run is finished)."""
    missing = tracking.trackers_missing(config.trackers)
    if missing:
        raise RunSetupError(f"trackers {missing} are not installed: pip install {' '.join(missing)}, or remove them")
    preflight(config, data, model_given=model_given)  # refusals raise; warnings are logged
    out = Path(config.output_dir)
    if not resume:
        if main:
            rundir.check_run_dir(out)  # fail before minutes of setup, not after
        return None
    if (out / rundir.SUMMARY_FILE).is_file():
        return None
    check_same_config(config, out)
    choice = run_state.choose_resume_point(out)
    if choice.path is None and choice.damaged:
        raise rundir.RunDirError(
            f"{out} has no usable resume point ({choice.describe_damaged()}): its files were changed or "
            f"cut short after they were written; restore them from a copy, or start the run again in a new "
            f"folder: dynamics run {out / rundir.CONFIG_FILE} --out NEW_DIR"
        )
    if not main:
        return choice
    if choice.path is None:
        # Stopped before its first resume point: nothing trained is lost by starting over.
        logger.warning("%s holds no complete resume point yet: the run starts again from step 0", out)
    elif choice.damaged:
        logger.warning(
            "%s: %s; resuming from %s/ (step %s) instead, and removing the damaged folder",
            out, choice.describe_damaged(), choice.path.name, choice.step,
        )
    else:
        logger.info("%s: resuming from %s/ (step %s)", out, choice.path.name, choice.step)
    return choice


def check_same_config(config: RunConfig, out: Path, how: str | None = None) -> None:
    """A resumed run must go on with the config it started with (saved in ``out``); ``how``
    says how to resume with the saved one (by default ``dynamics run --resume``). Where the
    folder was when the run started does not matter: a run folder can be moved or copied."""
    path = out / rundir.CONFIG_FILE
    if not path.is_file():
        raise RunSetupError(f"{path} is missing: {out} is not a run folder that can be resumed")
    saved = RunConfig.model_validate(yaml.safe_load(path.read_text()))
    saved = saved.model_copy(update={"output_dir": config.output_dir})
    if saved != config:
        mine, theirs = config.model_dump(mode="json"), saved.model_dump(mode="json")
        changed = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        raise RunSetupError(
            f"the config differs from the one {out} started with (in {', '.join(changed)}): resume with "
            f"the saved {path}, {how or f'e.g. dynamics run --resume {out}'}"
        )


def _is_main_process() -> bool:
    # Before the Accelerator exists: torchrun / accelerate set RANK for every process.
    return os.environ.get("RANK", "0") == "0"

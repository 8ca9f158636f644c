"""DynaMiCS inside a transformers ``Trainer`` (and trainers built on it, such as TRL's).

A user's script keeps its model, tokenizer, ``TrainingArguments`` and ``Trainer``, and adds
a :class:`DynamicsCallback` built from a run config (the same YAML as ``dynamics run``,
whose ``model`` section is then unused)::

    dynamics = DynamicsCallback(RunConfig.from_yaml("mixture.yaml"), tokenizer)
    trainer = Trainer(model=model, args=args, callbacks=[dynamics],
                      train_dataset=dynamics.train_dataset, data_collator=dynamics.data_collator)
    trainer.train()

The Trainer trains; the callback runs Algorithm 2 around it (docs/method.md). At every
update step it probes each dataset on the Trainer's own model, optimizer and LR scheduler
from one snapshot (rolled back after each probe, as in ``dynamics run``), solves for the
new mixture and hands it to the training data; at every main-evaluation step it evaluates
every target and constraint. It writes the same run folder as ``dynamics run``
(``config.yaml``, ``metrics.jsonl``, ``controller.jsonl``, ``summary.json``,
``best_checkpoint/``), which ``dynamics report`` reads.

How the mixture reaches the Trainer's batches. :class:`MixtureTrainSource` gives the
Trainer a dataset of placeholder rows and a collator that turns each micro-batch of them
into a :class:`PendingBatch`: the batch is drawn from the run's ``MixtureSampler`` only when
accelerate's dataloader moves it to the device, which happens when a step asks for it. A
batch drawn at collation would be too early: the dataloader collates one batch ahead of
the step being trained, so the first step after each update would train on the previous
mixture. A whole batch comes from one dataset with probability ``w_j``, from the same
seeded streams as ``dynamics run``, and the Trainer trains on exactly the batches
``dynamics run`` trains on; the callback checks the count at every step.

Resuming: with ``save_strategy="steps"`` the mixture's state goes into each checkpoint the
Trainer saves (``checkpoint-N/dynamics_state/``), and ``trainer.train(resume_from_checkpoint=...)``
with a callback built from the same config continues the mixture where it stood.

Several processes (torchrun, accelerate launch) draw one global batch per step and keep
their slices, as ``dynamics run`` does.

Limits, each refused with a message: no fp16 loss scaling (bf16 and fp32 work); no
backtracking (a Trainer's step counter cannot be wound back); ``dataloader_num_workers``
0 (batches are drawn in the training process, where the weights are).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from accelerate import Accelerator
from transformers import (
    PreTrainedTokenizerBase,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from dynamics.core.controller import Finished, LoopCallbacks, MixtureController
from dynamics.core.records import EvaluationRecord, RunHistory, UpdateRecord
from dynamics.engine import tracking
from dynamics.engine.components import (
    BroadcastPolicy,
    RankSlicedSampler,
    RunComponents,
    build_policy,
    controlled_learner,
)
from dynamics.engine.config import RunConfig
from dynamics.engine.launch import process_rank, world_size
from dynamics.engine.learner import BatchSampler, HFLearner
from dynamics.engine.preflight import RunSetupError, check_sources, sharded_launch
from dynamics.engine.run import check_same_config
from dynamics.engine.run_data import build_data
from dynamics.engine.run_folder import RunFolderWriter
from dynamics.engine.sampler import MixtureSampler
from dynamics.runs import rundir
from dynamics.runs import state as run_state

STATE_DIR = "dynamics_state"
"""The folder inside a Trainer checkpoint that holds the mixture's state."""


class PendingBatch:
    """A training batch that is drawn when the dataloader moves it to the device.

    accelerate's dataloader collates one batch ahead of the step being trained, but moves
    each batch to the device (``send_to_device`` calls ``.to``) only when the Trainer asks
    for it: after the previous step's callbacks, and so after a new mixture was set.
    Torch's ``pin_memory`` leaves an object that is neither a tensor nor a mapping as it is.
    """

    def __init__(self, source: MixtureTrainSource) -> None:
        self._source = source

    def to(self, device: torch.device | str, non_blocking: bool = False) -> dict[str, Any]:
        batch = self._source.draw()
        moved: dict[str, Any] = {
            key: value.to(device, non_blocking=non_blocking) for key, value in batch.items()
        }
        if "position_ids" in moved:
            # Blocks packed per document: with a key-value cache transformers ignores their
            # positions and lets the documents attend to each other.
            moved["use_cache"] = False
        return moved


class MixtureTrainSource:
    """Training data whose mixture weights change while a Trainer reads it (module doc).

    :attr:`dataset` is what the Trainer reads (``train_dataset``) and :meth:`collate` its
    ``data_collator``. The dataset's rows are placeholders (a ``datasets.Dataset`` with one
    ``input_ids`` column of zeros, which both the Trainer's column filter and TRL's
    ``SFTTrainer`` accept), ``batch_size`` per micro-batch and exactly as many as the run
    trains on (one epoch, in every process); the collator turns each group into a
    :class:`PendingBatch`, drawn from the sampler with the weights in force when it reaches
    the device.
    """

    def __init__(
        self, sampler: BatchSampler, batch_size: int, micro_batches: int, world: int = 1
    ) -> None:
        self.sampler = sampler
        self.batch_size = batch_size
        # Each of ``world`` processes reads its share of the rows: one epoch is the whole run.
        self.dataset = datasets.Dataset.from_dict(
            {"input_ids": [0] * (micro_batches * batch_size * world)}
        )
        self.weights: np.ndarray | None = None
        self.drawn = 0
        """Micro-batches drawn so far."""

    def collate(self, placeholders: Sequence[Any]) -> PendingBatch:
        """The data collator: one micro-batch, drawn when it reaches the device."""
        if len(placeholders) != self.batch_size:
            raise RunSetupError(
                f"the dataloader asked for a batch of {len(placeholders)} rows but the mixture "
                f"draws {self.batch_size}: set TrainingArguments.per_device_train_batch_size to "
                f"training.batch_size ({self.batch_size})"
            )
        return PendingBatch(self)

    def draw(self) -> Mapping[str, torch.Tensor]:
        """The next micro-batch: dataset j with probability ``w_j``, its stream's next batch."""
        if self.weights is None:
            raise RuntimeError(
                "the mixture has no weights yet: pass the DynamicsCallback to the Trainer's "
                "callbacks (it sets the weights when training begins)"
            )
        _, batch = self.sampler.next_batch(self.weights)
        self.drawn += 1
        return batch

    def set_weights(self, weights: np.ndarray) -> None:
        """Draw every batch from now on with ``weights`` (N,)."""
        self.weights = np.asarray(weights, dtype=float).copy()


class DynamicsCallback(TrainerCallback):
    """Runs DynaMiCS (or fixed weights, or gradient alignment) inside a transformers Trainer.

    Args:
        config: the run config: datasets and roles, method, evaluation, training sizes and
            seeds, ``output_dir`` for the run folder. Its ``model``, ``lora`` and
            ``optimizer`` sections are not used: the Trainer's model and optimizer are.
        tokenizer: the model's tokenizer; every dataset is tokenized with it here.
        data: rows by dataset name (``datasets.Dataset``) for the datasets whose config
            gives no path or hub id.

    Attributes:
        train_dataset: pass as the Trainer's ``train_dataset``.
        data_collator: pass as the Trainer's ``data_collator``.
        history: the run's :class:`RunHistory` once training ended.
        summary: ``summary.json``'s contents once training ended.
    """

    def __init__(
        self,
        config: RunConfig,
        tokenizer: PreTrainedTokenizerBase,
        data: Mapping[str, datasets.Dataset] | None = None,
    ) -> None:
        if config.method.backtrack:
            raise RunSetupError(
                "method.backtrack returns the model to an earlier step, which a Trainer's step "
                "counter cannot follow: set method.backtrack: 0, or run with dynamics run"
            )
        self.config = config
        self.tokenizer = tokenizer
        self.world = world = world_size()
        rank = process_rank()
        check_sources(config.datasets, data or {})
        self.data = build_data(
            config.datasets, config.training, config.evaluation, tokenizer, world, data
        )
        mixture_sampler = MixtureSampler(
            self.data.streams, seed=config.training.seed, sampling=config.training.sampling
        )
        self.sampler = RankSlicedSampler(mixture_sampler, rank, world)
        self.source = MixtureTrainSource(
            self.sampler,
            config.training.batch_size,
            micro_batches=config.training.total_steps * config.training.gradient_accumulation,
            world=world,
        )
        self.train_dataset = self.source.dataset
        self.data_collator = self.source.collate
        self.policy = build_policy(config, self.data.dataset_names, mixture_sampler.unit)
        self.history: RunHistory | None = None
        self.summary: dict[str, Any] | None = None
        self._controller: MixtureController | None = None  # None once training ended
        self._remaining = 0
        self._saved: dict[str, Any] | None = (
            None  # the controller's state at the last checkpoint step
        )
        self._log_values: dict[str, float] = {}  # the latest weights, slack and feasibility

    # --- Trainer events --------------------------------------------------------------

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: torch.nn.Module | None = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        **kwargs: Any,
    ) -> None:
        if model is None or optimizer is None or lr_scheduler is None:
            raise RunSetupError(
                "DynamicsCallback needs the Trainer's model, optimizer and LR scheduler "
                "at train begin"
            )
        self._check_trainer(args, state)
        started = time.perf_counter()
        # Shares the process state of the Trainer's accelerator (device, distributed setup).
        accelerator = Accelerator(cpu=not torch.cuda.is_available() or args.use_cpu)
        # Every rank probes (its share of the datasets, or all of them together) and adopts
        # rank 0's decision.
        policy = BroadcastPolicy(self.policy, accelerator)
        self._main = accelerator.is_main_process
        learner = HFLearner.around(
            model,
            optimizer,
            lr_scheduler,
            self.sampler,
            self.data.dataset_names,
            self.data.domains,
            accelerator=accelerator,
            max_grad_norm=args.max_grad_norm if args.max_grad_norm else None,
            gradient_accumulation=args.gradient_accumulation_steps,
            max_skipped_steps=self.config.training.max_skipped_steps,
        )
        learner.split_probes = self.config.training.split_probes
        parts = RunComponents(
            config=self.config,
            accelerator=accelerator,
            tokenizer=self.tokenizer,
            model=model,
            learner=learner,
            policy=policy,
            targets=self.data.targets,
            constraints=self.data.constraints,
            domain_metrics=self.data.domain_metrics,
        )
        out = Path(self.config.output_dir)
        if state.global_step == 0 and self._main:
            rundir.check_run_dir(
                out, allow=[self._trainer_dir(args)]
            )  # the Trainer's own folder may sit inside
            out.mkdir(parents=True, exist_ok=True)
            rundir.atomic_write_text(out / rundir.CONFIG_FILE, self.config.to_yaml())
        self._writer = RunFolderWriter(
            parts,
            out,
            progress=False,
            resume_how="trainer.train(resume_from_checkpoint=True) "
            "with a DynamicsCallback built from the same config",
        )
        self._controller = MixtureController(
            controlled_learner(
                parts.learner,
                self.config.evaluation.relative_noise,
                self.config.evaluation.noise_seed,
            ),
            policy,
            targets=self.data.targets,
            constraints=self.data.constraints,
            eval_interval=self.config.evaluation.interval,
            reduced_batches=self.config.evaluation.reduced_batches,
            callbacks=LoopCallbacks(
                self._on_evaluation, self._on_update, on_checkpoint=self._keep_loop_state
            ),
            checkpoint_steps=self._checkpoint_steps(args, state),
        )
        if state.global_step > 0:
            self._resume(args, state)
        self._writer.train_started = started
        self._advance()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._controller is None:
            return
        expected = state.global_step * args.gradient_accumulation_steps
        if self.source.drawn != expected:
            raise RuntimeError(
                f"after {state.global_step} steps the Trainer drew {self.source.drawn} batches of "
                f"the mixture instead of {expected}: pass train_dataset=callback.train_dataset and "
                "data_collator=callback.data_collator, and keep the Trainer's default dataloader "
                "(device placement on, batches not dispatched), "
                "whose batches are drawn when a step asks for them"
            )
        self._remaining -= 1
        if self._remaining == 0:
            self._advance()

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Put the mixture's state into the checkpoint the Trainer just wrote."""
        saved = self._saved
        if not self._main or saved is None or saved["step"] != state.global_step:
            return  # not a step the loop stopped at (the final one, or save_strategy "best")
        self._writer.save_resume_point(
            saved,
            self._checkpoint(args, state),
            STATE_DIR,
            extra={"sampler": self.sampler.state_dict(), "drawn": self.source.drawn},
        )

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Add the mixture's latest weights, worst slack and feasibility to the Trainer's log."""
        if logs is not None:
            logs.update(self._log_values)

    def log_before_trackers(self, trainer: Any) -> None:
        """Move this callback to the front of ``trainer``'s callbacks.

        Callbacks see each log in order. The Trainer puts its ``report_to`` integrations
        (TensorBoard, W&B, MLflow, ...) before the callbacks it is given, so without this
        the mixture's values reach the console log but not those trackers."""
        callbacks = trainer.callback_handler.callbacks
        callbacks.remove(self)
        callbacks.insert(0, self)

    # --- the loop ----------------------------------------------------------------------

    def _on_evaluation(self, record: EvaluationRecord, history: RunHistory) -> None:
        if self._main:
            self._writer.on_evaluation(record, history)
        if record.backtracked or record.step == 0:
            return
        row = self._writer.metrics_row(record, history)  # what metrics.jsonl holds for this step
        self._log_values.update(
            {f"dynamics/{k}": v for k, v in tracking.evaluation_values(row).items()}
        )

    def _on_update(self, update: UpdateRecord, history: RunHistory) -> None:
        if self._main:
            self._writer.on_update(update, history)
        values = tracking.update_values(update, history.dataset_names)
        self._log_values.update({f"dynamics/{k}": v for k, v in values.items()})

    @staticmethod
    def _trainer_dir(args: TrainingArguments) -> Path:
        return Path(args.output_dir or "trainer_output")  # transformers' own default

    @classmethod
    def _checkpoint(cls, args: TrainingArguments, state: TrainerState) -> Path:
        """The checkpoint folder the Trainer writes (or resumes) at this step."""
        return cls._trainer_dir(args) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"

    def _keep_loop_state(self, controller: MixtureController) -> None:
        self._saved = controller.state_dict()

    @staticmethod
    def _checkpoint_steps(args: TrainingArguments, state: TrainerState) -> list[int]:
        """The steps the Trainer saves checkpoints at: the loop stops there, so that its state
        can go into them."""
        if args.save_strategy != "steps" or not state.save_steps:
            return []
        return list(range(int(state.save_steps), int(state.max_steps), int(state.save_steps)))

    def _resume(self, args: TrainingArguments, state: TrainerState) -> None:
        """Put the controller, the data and the run folder back where the Trainer checkpoint
        being resumed stands (the Trainer restores the model, optimizer, scheduler and RNG
        itself)."""
        assert self._controller is not None
        checkpoint = self._checkpoint(args, state)
        point = checkpoint / STATE_DIR
        if run_state.find_resume_point(checkpoint, name=STATE_DIR) is None:
            raise RunSetupError(
                f"the Trainer resumes at step {state.global_step} but {point} holds no complete "
                "mixture state: resume from a checkpoint the Trainer saved with DynamicsCallback "
                "(save_strategy 'steps'), inside TrainingArguments.output_dir"
            )
        check_same_config(self.config, point, how="building the callback from it")
        saved = run_state.read_loop_file(point)
        self._controller.load_state_dict(
            saved["loop"]
        )  # no backtracking here: no feasible snapshot
        self.sampler.load_state_dict(saved["sampler"])
        self.source.drawn = int(saved["drawn"])
        self._writer.resume(self._controller.history, self._controller.step, saved, point)

    def _advance(self) -> None:
        """Run the loop to its next training stretch (evaluating and updating on the way)."""
        assert self._controller is not None
        request = self._controller.next()
        if isinstance(request, Finished):
            self._controller = None
            self.history = request.history
            self.summary = self._writer.finish(
                request.history, self._writer.train_seconds(), {"trainer": True}
            )
            return
        self.source.set_weights(request.weights)
        self._remaining = request.steps

    def _check_trainer(self, args: TrainingArguments, state: TrainerState) -> None:
        training = self.config.training
        problems = []
        # The schedule counts optimizer steps and each batch comes from one dataset.
        must_agree = (
            ("max_steps", "total_steps"),
            ("per_device_train_batch_size", "batch_size"),
            ("gradient_accumulation_steps", "gradient_accumulation"),
        )
        for trainer_field, config_field in must_agree:
            theirs, ours = getattr(args, trainer_field), getattr(training, config_field)
            if theirs != ours:
                problems.append(
                    f"TrainingArguments.{trainer_field} is {theirs} but training.{config_field} is "
                    f"{ours}: set both to the same value"
                )
        if args.world_size != self.world:
            problems.append(
                f"the Trainer runs {args.world_size} processes but the callback was built for "
                f"{self.world} (WORLD_SIZE): build it inside the launched script"
            )
        if args.fp16:
            problems.append(
                "fp16 loss scaling is not supported by DynamicsCallback: use bf16 or fp32"
            )
        launched = sharded_launch()
        sharded = (
            f"launched under {launched}" if launched else "TrainingArguments.fsdp or deepspeed"
        )
        if launched or args.fsdp or args.deepspeed:
            problems.append(
                f"sharded training ({sharded}) is not supported by DynamicsCallback: "
                "it saves its run folder from whole tensors only; "
                "train with plain data parallelism, or with dynamics run under FSDP2"
            )
        if args.dataloader_num_workers:
            problems.append(
                "TrainingArguments.dataloader_num_workers must be 0: the mixture draws each batch "
                "in the training process, where its weights change"
            )
        if problems:
            raise RunSetupError(
                "DynamicsCallback cannot run with this Trainer:\n- " + "\n- ".join(problems)
            )

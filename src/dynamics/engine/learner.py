"""The Learner for Hugging Face causal LMs (docs/method.md; paper section 3 and the appendices on
gradient alignment and accuracy constraints).

``HFLearner`` implements :class:`dynamics.core.learner.Learner` and
:class:`~dynamics.core.learner.AlignmentLearner`:

- ``train(steps, weights)``: ``steps`` optimizer steps; every micro-batch comes from the
  sampler, which draws dataset j with probability ``w_j``. A probe is the same call with
  one-hot weights.
- ``snapshot()`` / ``restore()``: exactly what a probe may change -- trainable parameters,
  optimizer state and hyper-parameters, LR scheduler, grad scaler (fp16), RNG (torch CPU and
  CUDA, python, numpy) and sampler -- as in-memory tensor copies. Frozen base weights under
  LoRA are never copied. After ``restore`` the run continues bit-identically, as if the
  probe had never happened.
- ``evaluate(split, num_batches)``: per-batch metrics on fixed cached batches, the reduced
  evaluation being the first ``num_batches`` of them.
- ``alignment_slopes(num_batches)``: the gradient-alignment baseline of appendix K.

``HFLearner`` composes the parts, each a module of ``dynamics.engine``: the training state
and its snapshots (``training_state``), optimizer steps (``steps``), evaluation
(``evaluation``), gradient alignment (``alignment``), and the losses they share
(``losses``). Data comes in through two small contracts, :class:`BatchSampler` (training)
and :class:`EvaluationDomain` (fixed evaluation batches), defined in
``dynamics.engine.data_contracts`` and built by ``dynamics.data`` /
``dynamics.engine.sampler``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, cast

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, gather_object
from torch import Tensor, nn

from dynamics.core.learner import DomainKind, Evaluation
from dynamics.core.probes import ProbeRuns, probe_in_turn
from dynamics.engine.alignment import adam_direction, alignment_slopes
from dynamics.engine.config import OptimizerConfig
from dynamics.engine.data_contracts import (
    Batch,
    BatchSampler,
    EvaluationDomain,
    SlicingSampler,
    check_domains,
)
from dynamics.engine.evaluation import Evaluator
from dynamics.engine.losses import choice_logits, training_loss
from dynamics.engine.model import trainable_parameters
from dynamics.engine.steps import OptimizerSteps
from dynamics.engine.training_state import (
    RNGState,
    TrainingSnapshot,
    adopted_training_state,
    load_snapshot,
    prepared_training_state,
    save_snapshot,
)

__all__ = [
    "Batch",
    "BatchSampler",
    "BuiltOptimizer",
    "EvaluationDomain",
    "HFLearner",
    "LoneProbes",
    "RNGState",
    "SlicingSampler",
    "TrainingSnapshot",
    "adam_direction",
    "choice_logits",
    "load_snapshot",
    "save_snapshot",
    "trainable_parameters",
]


@dataclass(frozen=True)
class BuiltOptimizer:
    """An optimizer and LR scheduler that another loop built and steps (a transformers
    ``Trainer``'s). ``optimizer`` is the accelerate-prepared optimizer (its ``.optimizer``
    the torch one) or a torch optimizer; ``lr_scheduler`` is stepped once per optimizer
    step; ``max_grad_norm`` is the loop's gradient clip (None: no clipping)."""

    optimizer: Any
    lr_scheduler: Any
    max_grad_norm: float | None


class HFLearner:
    """A Hugging Face causal LM being fine-tuned on a dynamic mixture.

    Args:
        model: the model to train, already wrapped for LoRA or fully trainable (see
            :func:`dynamics.engine.model.prepare_model`). Only parameters with
            ``requires_grad`` are optimized, snapshotted and restored.
        sampler: the training-batch sampler over the N fine-tuning datasets.
        dataset_names: names of the N fine-tuning datasets, in weight-vector order.
        domains: the M evaluation domains, in slope-matrix row order. Every domain must hold
            the same number of eval batches (and of test batches): an evaluation is an
            (M, B) array.
        optimizer: AdamW hyper-parameters and LR schedule, from which the learner builds its
            optimizer and scheduler and prepares them and ``model`` with ``accelerator``; or
            a :class:`BuiltOptimizer` that another loop built, used as it is on ``model`` as
            that loop prepared it (see :meth:`around`).
        total_steps: optimizer steps of the main run (the horizon of a decaying schedule);
            required with an ``OptimizerConfig``.
        gradient_accumulation: micro-batches per optimizer step; each micro-batch is drawn
            from the mixture independently.
        accelerator: device placement, mixed precision and distributed wrapping; a default
            ``Accelerator()`` when None.
        max_skipped_steps: main-run steps with a non-finite loss or gradient tolerated
            before ``train`` raises :class:`~dynamics.core.learner.Diverged`.
    """

    def __init__(
        self,
        model: nn.Module,
        sampler: BatchSampler,
        dataset_names: Sequence[str],
        domains: Sequence[EvaluationDomain],
        optimizer: OptimizerConfig | BuiltOptimizer,
        total_steps: int | None = None,
        gradient_accumulation: int = 1,
        accelerator: Accelerator | None = None,
        max_skipped_steps: int = 8,
    ) -> None:
        if gradient_accumulation < 1:
            raise ValueError(f"gradient_accumulation must be >= 1, got {gradient_accumulation}")
        if not dataset_names:
            raise ValueError(
                "dataset_names is empty: the learner needs at least one fine-tuning dataset"
            )
        check_domains(domains)
        self.domains = list(domains)
        self._dataset_names = list(dataset_names)
        self.last_train_loss = float("nan")
        """Mean training loss of the last step of the last ``train`` call (display only)."""
        self.split_probes = True
        """Under several processes, let each process probe its own datasets (see
        :meth:`probe_all`); False makes every process take part in every probe."""
        accelerator = accelerator if accelerator is not None else Accelerator()
        if isinstance(optimizer, OptimizerConfig):
            if total_steps is None:
                raise ValueError("total_steps is required to build the optimizer's LR schedule")
            self._state = prepared_training_state(
                model, sampler, optimizer, total_steps, accelerator
            )
            built = BuiltOptimizer(
                self._state.optimizer, self._state.lr_scheduler, optimizer.max_grad_norm
            )
            average_gradients = False  # prepare wrapped the model for DDP where needed
        else:
            built = optimizer
            self._state = adopted_training_state(
                model, sampler, built.optimizer, built.lr_scheduler, accelerator
            )
            # An unwrapped model under several processes: probes average gradients themselves
            # (a sharded model reduces its gradients in its own backward).
            average_gradients = (
                accelerator.num_processes > 1
                and not hasattr(model, "no_sync")
                and not self._state.sharded
            )
        self._steps = OptimizerSteps(
            self._state,
            self._dataset_names,
            gradient_accumulation=gradient_accumulation,
            max_grad_norm=built.max_grad_norm,
            max_skipped_steps=max_skipped_steps,
            average_gradients=average_gradients,
        )
        self._evaluator = Evaluator(self._state)

    @classmethod
    def around(
        cls,
        model: nn.Module,
        optimizer: Any,
        lr_scheduler: Any,
        sampler: BatchSampler,
        dataset_names: Sequence[str],
        domains: Sequence[EvaluationDomain],
        *,
        accelerator: Accelerator,
        max_grad_norm: float | None,
        gradient_accumulation: int = 1,
        max_skipped_steps: int = 8,
    ) -> HFLearner:
        """A learner on a model, optimizer and LR scheduler that another loop built and
        steps (a transformers ``Trainer``'s): probes, snapshots and evaluations act on them
        exactly as on the learner's own. ``optimizer`` is the accelerate-prepared optimizer
        (its ``.optimizer`` the torch one) or a torch optimizer; ``lr_scheduler`` is stepped
        once per optimizer step, as the other loop does. ``train`` is that loop's job, but
        works too."""
        return cls(
            model,
            sampler,
            dataset_names,
            domains,
            BuiltOptimizer(optimizer, lr_scheduler, max_grad_norm),
            gradient_accumulation=gradient_accumulation,
            accelerator=accelerator,
            max_skipped_steps=max_skipped_steps,
        )

    # --- what the parts hold -----------------------------------------------------------

    @property
    def model(self) -> nn.Module:
        """The model as trained: wrapped by the accelerator (DDP) where it prepared it."""
        return self._state.model

    @property
    def optimizer(self) -> Any:
        """Accelerate's wrapper of :attr:`torch_optimizer` (device placement, fp16 scaling)."""
        return self._state.optimizer

    @property
    def torch_optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer, whose state snapshots copy."""
        return self._state.torch_optimizer

    @property
    def lr_scheduler(self) -> Any:
        return self._state.lr_scheduler

    @property
    def accelerator(self) -> Accelerator:
        return self._state.accelerator

    @property
    def sampler(self) -> BatchSampler:
        return self._state.sampler

    @property
    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters trained, snapshotted and restored (under FSDP2, this rank's shards)."""
        return self._state.trainable_parameters

    @property
    def sharded(self) -> bool:
        """Whether the trainable parameters are shards (FSDP2): each rank holds a part."""
        return self._state.sharded

    @property
    def main_steps(self) -> int:
        """Main-run optimizer steps taken, skipped ones included."""
        return self._state.main_steps

    @property
    def skipped_steps(self) -> list[dict[str, Any]]:
        """Main-run steps skipped for a non-finite loss or gradient: step and datasets."""
        return self._state.skipped_steps

    @property
    def gradient_accumulation(self) -> int:
        return self._steps.gradient_accumulation

    @property
    def max_grad_norm(self) -> float | None:
        return self._steps.max_grad_norm

    @property
    def max_skipped_steps(self) -> int:
        return self._steps.max_skipped_steps

    # --- the Learner protocol --------------------------------------------------------

    @property
    def dataset_names(self) -> list[str]:
        return list(self._dataset_names)

    @property
    def domain_names(self) -> list[str]:
        return [domain.name for domain in self.domains]

    @property
    def domain_kinds(self) -> list[DomainKind]:
        # Every fixed batch of a domain holds the same number of examples (they are cycled).
        return [
            DomainKind(domain.metric, len(domain.eval_batches[0]["input_ids"]))
            for domain in self.domains
        ]

    def train(self, steps: int, weights: np.ndarray) -> None:
        """Take ``steps`` optimizer steps on batches drawn with mixture ``weights`` (N,)."""
        weights = np.asarray(weights, dtype=float)
        if weights.shape != (len(self._dataset_names),):
            raise ValueError(
                f"weights must have shape ({len(self._dataset_names)},), got {weights.shape}"
            )
        loss = self._steps.take(
            steps, lambda: self.sampler.next_batch(weights), self._training_loss, probing=False
        )
        # One host sync per call (not per step), for progress display only.
        self.last_train_loss = float(loss)

    def probe(self, steps: int, dataset: int) -> None:
        """Algorithm 1's probe: ``steps`` optimizer steps on dataset ``dataset`` alone, its
        batches drawn from the dataset's own probe stream, so probing never changes the
        main run's data order and each update probes on fresh batches."""
        _check_dataset(dataset, len(self._dataset_names))
        self._steps.take(
            steps,
            lambda: (dataset, self.sampler.probe_batch(dataset)),
            self._training_loss,
            probing=True,
        )

    def evaluate(self, split: str, num_batches: int | None = None) -> Evaluation:
        """Per-batch metrics ``(M, R)`` on the first ``num_batches`` fixed batches of ``split``
        (``"eval"`` or ``"test"``; all when None): mean token cross-entropy (nats) for loss
        domains, negative accuracy (in [-1, 0]) for accuracy domains.

        Runs in eval mode (no dropout) without gradients; draws no random numbers and
        leaves the training state untouched. Under several processes the batches are
        shared out (batch ``b`` to rank ``b mod P``) and the per-batch values gathered, so
        every rank returns the whole array, the same as one process computes.
        """
        return self._evaluator.evaluate(self.domains, split, num_batches, alone=False)

    def snapshot(self) -> TrainingSnapshot:
        """Copy the training state (trainable weights, optimizer, scheduler, RNG, sampler)."""
        return self._state.snapshot()

    def restore(self, snapshot: TrainingSnapshot) -> None:
        """Return to ``snapshot`` by copying into the live tensors; ``snapshot`` stays valid.
        Under FSDP2 each rank copies its own shards."""
        self._state.restore(snapshot)

    def alignment_slopes(self, num_batches: int) -> np.ndarray:
        """Gradient-alignment slope matrix, shape (M, N), in metric units per optimizer step
        (see :func:`dynamics.engine.alignment.alignment_slopes`). The training state is
        unchanged."""
        return alignment_slopes(self._state, self.domains, len(self._dataset_names), num_batches)

    # --- probing shared out among processes ---------------------------------------------

    def probe_all(self, checkpoints: Sequence[int], num_batches: int) -> ProbeRuns:
        """Every probe of one update, from the current state, which is restored afterwards
        (:class:`dynamics.core.probes.ProbingLearner`).

        One process probes the datasets in turn. Under ``P`` processes with ``N`` a
        multiple of ``P`` (and ``split_probes``, and unsharded parameters), process ``r``
        probes datasets ``r, r + P, ...`` on its own (:class:`LoneProbes`): each probe step
        runs the global batch's ``P`` slices one after another on the unwrapped module (the
        same memory per process, the same gradient as all processes together) and
        evaluates every reduced batch itself; the evaluations are then summed across
        processes (each dataset's are non-zero on one process only) and the probe streams'
        positions shared, so every process holds what one process would have measured.
        Otherwise every process takes part in every probe, as in data-parallel training.
        The work is the same either way; probing alone saves the per-step gradient
        all-reduce and the snapshot restores (``N / P + 1`` per process instead of ``N + 1``).
        """
        count = len(self._dataset_names)
        world = self.accelerator.num_processes
        snapshot = self.snapshot()
        if not self._splits_probes():
            evaluations, expected, seconds = probe_in_turn(
                self, range(count), checkpoints, num_batches, snapshot
            )
            self.restore(snapshot)
            return ProbeRuns(
                evaluations, seconds, [list(range(world)) for _ in range(count)], expected
            )
        mine = list(range(self.accelerator.process_index, count, world))
        lone = LoneProbes(self, self._steps, self._evaluator)
        local, local_expected, local_seconds = probe_in_turn(
            lone, mine, checkpoints, num_batches, snapshot
        )
        self.restore(snapshot)
        assert local_expected is not None  # the evaluator measures expected accuracies
        return self._shared_probe_runs(mine, np.stack([local, local_expected]), local_seconds)

    def _shared_probe_runs(
        self, mine: list[int], local: np.ndarray, local_seconds: np.ndarray
    ) -> ProbeRuns:
        """Every process's probes of its datasets ``mine`` (``local``: their evaluations and
        expected evaluations, (2, len(mine), K, M, R)) summed into one ``ProbeRuns``, and the
        probe streams' positions shared."""
        count = len(self._dataset_names)
        world = self.accelerator.num_processes
        device = self.accelerator.device
        shared = torch.zeros((2, count, *local.shape[2:]), dtype=torch.float64, device=device)
        shared[:, mine] = torch.from_numpy(local).to(device)
        shared_seconds = torch.zeros(count, dtype=torch.float64, device=device)
        shared_seconds[mine] = torch.from_numpy(local_seconds).to(device)
        shared = self.accelerator.reduce(shared, reduction="sum")
        shared_seconds = self.accelerator.reduce(shared_seconds, reduction="sum")
        # Each process moved only its own datasets' probe streams.
        state = self.sampler.state_dict()
        for j, stream in gather_object([(j, state["probe_streams"][j]) for j in mine]):
            state["probe_streams"][j] = stream
        self.sampler.load_state_dict(state)
        evaluations, expected = shared.cpu().numpy()
        return ProbeRuns(
            evaluations, shared_seconds.cpu().numpy(), [[j % world] for j in range(count)], expected
        )

    def _splits_probes(self) -> bool:
        world = self.accelerator.num_processes
        sharded = self.accelerator.distributed_type in (
            DistributedType.FSDP,
            DistributedType.DEEPSPEED,
            DistributedType.MEGATRON_LM,
        )
        return (
            world > 1
            and self.split_probes
            and len(self._dataset_names) % world == 0
            and not sharded
            and not self.sharded
            and isinstance(self.sampler, SlicingSampler)
        )

    # --- resume points and sharding ------------------------------------------------------

    def load_training_state(self, snapshot: TrainingSnapshot) -> None:
        """Resume from ``snapshot`` (read from disk): :meth:`restore`, and the probe streams'
        positions too, which a probe's rollback leaves where they are. Whole tensors (what
        :meth:`gathered` gave to be saved) are cut into this rank's shards under sharding."""
        self._state.load(snapshot)

    def gathered(self, snapshot: TrainingSnapshot) -> TrainingSnapshot:
        """``snapshot`` with every shard gathered into its whole tensor on the CPU (see
        :meth:`TrainingState.gathered`); every rank calls it. Unsharded, ``snapshot`` itself."""
        return self._state.gathered(snapshot)

    def cut_into_shards(self, snapshot: TrainingSnapshot) -> TrainingSnapshot:
        """The inverse of :meth:`gathered`: a snapshot of whole tensors (read from a run folder)
        cut into this rank's shards of the live parameters. Every rank calls it."""
        return self._state.cut_into_shards(snapshot)

    def gathered_model_state(self) -> dict[str, Tensor] | None:
        """Under sharding, the model's whole state dict on the CPU (rank 0's copy; every
        rank must call it), for saving it as one model; None when not sharded (the model's
        own ``state_dict`` is whole)."""
        return self._state.gathered_model_state()

    # --- internals ---------------------------------------------------------------------

    def _training_loss(self, batch: Batch) -> Tensor:
        """The loss of this process's slice of one training micro-batch (see
        :func:`dynamics.engine.losses.training_loss`); ``train`` and ``probe`` take it
        through this method."""
        return training_loss(self.model, batch, self.accelerator)


class LoneProbes:
    """The learner as one process sees it while it probes its own datasets on its own
    (:meth:`HFLearner.probe_all`): ``probe`` runs every rank's slice of each global probe
    batch in this process, and ``evaluate`` evaluates every batch itself; neither
    exchanges anything with the other processes. It never trains the main run."""

    def __init__(self, learner: HFLearner, steps: OptimizerSteps, evaluator: Evaluator) -> None:
        self._learner = learner
        self._steps = steps
        self._evaluator = evaluator

    @property
    def dataset_names(self) -> list[str]:
        return self._learner.dataset_names

    @property
    def domain_names(self) -> list[str]:
        return self._learner.domain_names

    @property
    def domain_kinds(self) -> list[DomainKind]:
        return self._learner.domain_kinds

    def probe(self, steps: int, dataset: int) -> None:
        _check_dataset(dataset, len(self._learner.dataset_names))
        sampler = cast(SlicingSampler, self._learner.sampler)
        self._steps.take_alone(steps, lambda: (dataset, sampler.probe_slices(dataset)))

    def evaluate(self, split: str, num_batches: int | None = None) -> Evaluation:
        return self._evaluator.evaluate(self._learner.domains, split, num_batches, alone=True)

    def train(self, steps: int, weights: np.ndarray) -> NoReturn:
        raise TypeError("a process probing on its own does not train the main run")

    def snapshot(self) -> TrainingSnapshot:
        return self._learner.snapshot()

    def restore(self, snapshot: TrainingSnapshot) -> None:
        self._learner.restore(snapshot)


def _check_dataset(dataset: int, count: int) -> None:
    if not 0 <= dataset < count:
        raise ValueError(f"dataset index {dataset} outside [0, {count - 1}]")

"""The Learner for Hugging Face causal LMs (docs/method.md; paper section 3 and the appendices on gradient alignment and accuracy constraints).

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

Data comes in through two small contracts, :class:`BatchSampler` (training) and
:class:`EvaluationDomain` (fixed evaluation batches), built by ``dynamics.data`` /
``dynamics.engine.sampler``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, cast, runtime_checkable

import numpy as np
import safetensors.torch
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import DistributedType, gather_object
from peft import PeftModel
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

from dynamics.core.learner import Diverged, DomainKind, Evaluation
from dynamics.core.probes import ProbeRuns, probe_in_turn
from dynamics.data.formatting import IGNORE_INDEX
from dynamics.engine.batches import model_inputs
from dynamics.engine.config import OptimizerConfig
from dynamics.engine.model import build_lr_scheduler, build_optimizer, trainable_parameters

logger = logging.getLogger(__name__)

Batch = Mapping[str, Tensor]
"""A batch of right-padded sequences.

Training and loss domains: ``input_ids``, ``attention_mask`` and ``labels`` (B, T), with
label -100 on tokens that carry no loss (blocks packed per document: ``position_ids``
instead of ``attention_mask``). Accuracy domains: ``input_ids`` and
``attention_mask`` (B, T) of the prompt ending right before the answer letter,
``choice_token_ids`` (B, K) and ``answer_index`` (B,).
"""


class BatchSampler(Protocol):
    """Draws training batches from the weighted mixture of the N fine-tuning datasets."""

    def next_batch(self, weights: np.ndarray) -> tuple[int, Batch]:
        """One batch, from dataset j with probability ``weights[j]``; returns (j, batch)."""
        ...

    def probe_batch(self, dataset: int) -> Batch:
        """The next batch of dataset ``dataset``'s own probe stream (main order untouched)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Main streams and choice RNG under ``"streams"``/``"choice_rng"``, probe streams
        under ``"probe_streams"``."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class SlicingSampler(BatchSampler, Protocol):
    """A sampler of one rank's slice of each global batch, which can also hand a rank that
    probes on its own every rank's slice (:meth:`HFLearner.probe_all`)."""

    def probe_slices(self, dataset: int) -> list[Batch]:
        """The next global probe batch of ``dataset``, as the list of every rank's slice."""
        ...


class EvaluationDomain(Protocol):
    """An evaluation domain E_i with its fixed evaluation and test batches."""

    @property
    def name(self) -> str: ...

    @property
    def metric(self) -> Literal["loss", "accuracy"]: ...

    @property
    def eval_batches(self) -> Sequence[Batch]: ...

    @property
    def test_batches(self) -> Sequence[Batch]: ...


@dataclass(frozen=True)
class RNGState:
    """Every random number generator a training step may draw from."""

    torch_cpu: Tensor
    torch_cuda: list[Tensor] | None  # one state per visible GPU; None without CUDA
    python: tuple[Any, ...]
    numpy: tuple[Any, ...] | dict[str, Any]

    @classmethod
    def capture(cls) -> RNGState:
        return cls(
            torch_cpu=torch.get_rng_state(),
            torch_cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            python=random.getstate(),
            # The legacy global generator is what user code and libraries draw from.
            numpy=np.random.get_state(),  # noqa: NPY002
        )

    def apply(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state_all(self.torch_cuda)
        random.setstate(self.python)
        np.random.set_state(self.numpy)  # noqa: NPY002


@dataclass(frozen=True)
class TrainingSnapshot:
    """In-memory copy of everything ``train`` changes (the paper's probe rollback).

    ``parameters`` and ``optimizer_state`` follow the order of the trainable parameters;
    ``optimizer_state[k]`` is None when Adam has not yet initialised that parameter's
    moments (a snapshot taken at step 0), and restoring then removes them again.
    """

    parameters: list[Tensor]
    optimizer_state: list[dict[str, Any] | None]
    param_group_settings: list[dict[str, Any]]  # lr etc. per param group; the scheduler writes lr
    lr_scheduler: dict[str, Any]
    grad_scaler: dict[str, Any] | None  # fp16 loss scale; None without fp16
    sampler: dict[str, Any]
    rng: RNGState
    main_steps: int = 0  # main-run optimizer steps taken (skipped ones included)
    skipped_steps: tuple[dict[str, Any], ...] = ()  # main-run steps with a non-finite loss


def _to_json(value: Any, tensors: dict[str, Tensor]) -> Any:
    """``value`` as JSON, its tensors moved into ``tensors`` (and named there); tuples and
    numpy arrays are tagged so that :func:`_from_json` gives back the same types."""
    if isinstance(value, Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = value.detach().cpu().clone().contiguous()
        return {"__tensor__": name}
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, tuple):
        return {"__tuple__": [_to_json(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_to_json(v, tensors) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            # Optimizer and scheduler states keyed by integers keep their key types.
            return {"__items__": [[_to_json(k, tensors), _to_json(v, tensors)] for k, v in value.items()]}
        return {k: _to_json(v, tensors) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot save a {type(value).__name__} in a resume point")


def _from_json(value: Any, tensors: Mapping[str, Tensor]) -> Any:
    if isinstance(value, list):
        return [_from_json(v, tensors) for v in value]
    if isinstance(value, dict):
        if "__tensor__" in value:
            return tensors[value["__tensor__"]]
        if "__ndarray__" in value:
            return np.array(value["__ndarray__"], dtype=value["dtype"])
        if "__tuple__" in value:
            return tuple(_from_json(v, tensors) for v in value["__tuple__"])
        if "__items__" in value:
            return {_from_json(k, tensors): _from_json(v, tensors) for k, v in value["__items__"]}
        return {k: _from_json(v, tensors) for k, v in value.items()}
    return value


def save_snapshot(snapshot: TrainingSnapshot, folder: Path, name: str) -> None:
    """Write ``snapshot`` as ``name.safetensors`` (every tensor) and ``name.json`` (the rest)."""
    tensors: dict[str, Tensor] = {}
    meta = _to_json(
        {
            "parameters": snapshot.parameters,
            "optimizer_state": snapshot.optimizer_state,
            "param_group_settings": snapshot.param_group_settings,
            "lr_scheduler": snapshot.lr_scheduler,
            "grad_scaler": snapshot.grad_scaler,
            "sampler": snapshot.sampler,
            "main_steps": snapshot.main_steps,
            "skipped_steps": list(snapshot.skipped_steps),
            "rng": {
                "torch_cpu": snapshot.rng.torch_cpu,
                "torch_cuda": snapshot.rng.torch_cuda,
                "python": snapshot.rng.python,
                "numpy": snapshot.rng.numpy,
            },
        },
        tensors,
    )
    safetensors.torch.save_file(tensors, str(folder / f"{name}.safetensors"))
    (folder / f"{name}.json").write_text(json.dumps(meta, allow_nan=False))


def load_snapshot(folder: Path, name: str) -> TrainingSnapshot:
    """Read what :func:`save_snapshot` wrote (safetensors and JSON only: nothing unpickled)."""
    tensors = safetensors.torch.load_file(str(folder / f"{name}.safetensors"))
    data = _from_json(json.loads((folder / f"{name}.json").read_text()), tensors)
    rng = data["rng"]
    return TrainingSnapshot(
        parameters=data["parameters"],
        optimizer_state=data["optimizer_state"],
        param_group_settings=data["param_group_settings"],
        lr_scheduler=data["lr_scheduler"],
        grad_scaler=data["grad_scaler"],
        sampler=data["sampler"],
        rng=RNGState(torch_cpu=rng["torch_cpu"], torch_cuda=rng["torch_cuda"], python=rng["python"], numpy=rng["numpy"]),
        main_steps=int(data["main_steps"]),
        skipped_steps=tuple(data["skipped_steps"]),
    )


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
        optimizer: AdamW hyper-parameters and LR schedule.
        total_steps: optimizer steps of the main run (the horizon of a decaying schedule).
        gradient_accumulation: micro-batches per optimizer step; each micro-batch is drawn
            from the mixture independently.
        accelerator: device placement, mixed precision and distributed wrapping; a default
            ``Accelerator()`` when None.
    """

    def __init__(
        self,
        model: nn.Module,
        sampler: BatchSampler,
        dataset_names: Sequence[str],
        domains: Sequence[EvaluationDomain],
        optimizer: OptimizerConfig,
        total_steps: int,
        gradient_accumulation: int = 1,
        accelerator: Accelerator | None = None,
        max_skipped_steps: int = 8,
    ) -> None:
        self._attach_data(sampler, dataset_names, domains, gradient_accumulation, max_skipped_steps)
        self.max_grad_norm = optimizer.max_grad_norm
        self.accelerator = accelerator if accelerator is not None else Accelerator()
        if self.accelerator.gradient_accumulation_steps != 1:
            # The learner accumulates itself (mixture draws per micro-batch); accelerate's own
            # accumulation would divide the loss a second time and skip optimizer steps.
            raise ValueError(
                "pass gradient_accumulation to HFLearner and leave the Accelerator's "
                f"gradient_accumulation_steps at 1 (got {self.accelerator.gradient_accumulation_steps})"
            )

        self.trainable_parameters = trainable_parameters(model)
        # The raw torch optimizer and scheduler hold the state that snapshots copy; the
        # accelerator's wrapper adds device placement and fp16 loss scaling. The scheduler is
        # deliberately not handed to ``prepare``: accelerate would step it once per process,
        # while our schedule counts optimizer steps.
        self.torch_optimizer = build_optimizer(self.trainable_parameters, optimizer)
        self.lr_scheduler = build_lr_scheduler(self.torch_optimizer, optimizer, total_steps)
        self.model, self.optimizer = self.accelerator.prepare(model, self.torch_optimizer)
        # Sharding (FSDP) replaces the parameters, and prepare points the optimizer at the
        # new ones: those are what is trained, snapshotted and restored.
        self.trainable_parameters = [p for group in self.torch_optimizer.param_groups for p in group["params"]]
        self._sharded = _is_sharded(self.trainable_parameters)
        self.model.train()
        self._average_gradients = False  # prepare wrapped the model for DDP where needed

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
        self = cls.__new__(cls)
        self._attach_data(sampler, dataset_names, domains, gradient_accumulation, max_skipped_steps)
        self.max_grad_norm = max_grad_norm
        self.accelerator = accelerator
        self.trainable_parameters = trainable_parameters(model)
        self.torch_optimizer = getattr(optimizer, "optimizer", optimizer)
        self.optimizer = optimizer if hasattr(optimizer, "step_was_skipped") else accelerator.prepare_optimizer(optimizer)
        self.lr_scheduler = lr_scheduler
        self.model = model
        self._sharded = _is_sharded(self.trainable_parameters)
        # An unwrapped model under several processes: probes average gradients themselves
        # (a sharded model reduces its gradients in its own backward).
        self._average_gradients = accelerator.num_processes > 1 and not hasattr(model, "no_sync") and not self._sharded
        return self

    def _attach_data(
        self,
        sampler: BatchSampler,
        dataset_names: Sequence[str],
        domains: Sequence[EvaluationDomain],
        gradient_accumulation: int,
        max_skipped_steps: int,
    ) -> None:
        if gradient_accumulation < 1:
            raise ValueError(f"gradient_accumulation must be >= 1, got {gradient_accumulation}")
        if not dataset_names:
            raise ValueError(
                "dataset_names is empty: the learner needs at least one fine-tuning dataset"
            )
        _check_domains(domains)
        self.sampler = sampler
        self.domains = list(domains)
        self._dataset_names = list(dataset_names)
        self.gradient_accumulation = gradient_accumulation
        self.last_train_loss = float("nan")
        """Mean training loss of the last step of the last ``train`` call (display only)."""
        self.max_skipped_steps = max_skipped_steps
        self.split_probes = True
        """Under several processes, let each process probe its own datasets (see
        :meth:`probe_all`); False makes every process take part in every probe."""
        self._alone = False  # this process is probing on its own (see probe_all)
        self.main_steps = 0
        self.skipped_steps: list[dict[str, Any]] = []
        """Main-run steps skipped for a non-finite loss or gradient: step and datasets."""

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
        return [DomainKind(domain.metric, len(domain.eval_batches[0]["input_ids"])) for domain in self.domains]

    def train(self, steps: int, weights: np.ndarray) -> None:
        """Take ``steps`` optimizer steps on batches drawn with mixture ``weights`` (N,)."""
        weights = np.asarray(weights, dtype=float)
        if weights.shape != (len(self._dataset_names),):
            raise ValueError(
                f"weights must have shape ({len(self._dataset_names)},), got {weights.shape}"
            )
        loss = self._optimizer_steps(steps, lambda: self.sampler.next_batch(weights), probing=False)
        # One host sync per call (not per step), for progress display only.
        self.last_train_loss = float(loss)

    def probe(self, steps: int, dataset: int) -> None:
        """Algorithm 1's probe: ``steps`` optimizer steps on dataset ``dataset`` alone, its
        batches drawn from the dataset's own probe stream, so probing never changes the
        main run's data order and each update probes on fresh batches."""
        if not 0 <= dataset < len(self._dataset_names):
            raise ValueError(f"dataset index {dataset} outside [0, {len(self._dataset_names) - 1}]")
        if self._alone:
            sampler = cast(SlicingSampler, self.sampler)
            self._optimizer_steps(steps, lambda: (dataset, sampler.probe_slices(dataset)), probing=True)
        else:
            self._optimizer_steps(steps, lambda: (dataset, self.sampler.probe_batch(dataset)), probing=True)

    def probe_all(self, checkpoints: Sequence[int], num_batches: int) -> ProbeRuns:
        """Every probe of one update, from the current state, which is restored afterwards
        (:class:`dynamics.core.probes.ProbingLearner`).

        One process probes the datasets in turn. Under ``P`` processes with ``N`` a
        multiple of ``P`` (and ``split_probes``, and unsharded parameters), process ``r``
        probes datasets ``r, r + P, ...`` on its own: each probe step runs the global
        batch's ``P`` slices one after another on the unwrapped module (the same memory
        per process, the same gradient as all processes together) and evaluates every
        reduced batch itself; the evaluations are then summed across processes (each
        dataset's are non-zero on one process only) and the probe streams' positions
        shared, so every process holds what one process would have measured. Otherwise
        every process takes part in every probe, as in data-parallel training. The work
        is the same either way; probing alone saves the per-step gradient all-reduce and
        the snapshot restores (``N / P + 1`` per process instead of ``N + 1``).
        """
        count = len(self._dataset_names)
        world = self.accelerator.num_processes
        snapshot = self.snapshot()
        if not self._splits_probes():
            evaluations, seconds = probe_in_turn(self, range(count), checkpoints, num_batches, snapshot)
            self.restore(snapshot)
            return ProbeRuns(evaluations, seconds, [list(range(world)) for _ in range(count)])
        mine = list(range(self.accelerator.process_index, count, world))
        self._alone = True
        try:
            local, local_seconds = probe_in_turn(self, mine, checkpoints, num_batches, snapshot)
        finally:
            self._alone = False
        self.restore(snapshot)
        device = self.accelerator.device
        shared = torch.zeros((count, *local.shape[1:]), dtype=torch.float64, device=device)
        shared[mine] = torch.from_numpy(local).to(device)
        shared_seconds = torch.zeros(count, dtype=torch.float64, device=device)
        shared_seconds[mine] = torch.from_numpy(local_seconds).to(device)
        shared = self.accelerator.reduce(shared, reduction="sum")
        shared_seconds = self.accelerator.reduce(shared_seconds, reduction="sum")
        # Each process moved only its own datasets' probe streams.
        state = self.sampler.state_dict()
        for j, stream in gather_object([(j, state["probe_streams"][j]) for j in mine]):
            state["probe_streams"][j] = stream
        self.sampler.load_state_dict(state)
        return ProbeRuns(shared.cpu().numpy(), shared_seconds.cpu().numpy(), [[j % world] for j in range(count)])

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
            and not self._sharded
            and isinstance(self.sampler, SlicingSampler)
        )

    def _optimizer_steps(
        self, steps: int, next_batch: Callable[[], tuple[int, Batch | list[Batch]]], probing: bool
    ) -> Tensor:
        """Train ``steps`` optimizer steps; returns the last step's loss (on device).

        A step whose loss or gradient norm is not finite is never applied. In a probe it
        raises :class:`Diverged`; in the main run the step is skipped (its batches are
        consumed, the parameters, optimizer and schedule stay as they were), recorded in
        ``skipped_steps``, and once more than ``max_skipped_steps`` were skipped the run
        stops with :class:`Diverged`.
        """
        self.model.train()
        step_loss = torch.zeros((), device=self.accelerator.device)
        for _ in range(steps):
            step_loss = torch.zeros((), device=self.accelerator.device)
            datasets = []
            for micro_step in range(self.gradient_accumulation):
                dataset, batch = next_batch()
                datasets.append(dataset)
                if isinstance(batch, list):  # every rank's slice: this process probes alone
                    step_loss = step_loss + self._backward_alone(batch)
                    continue
                last = micro_step == self.gradient_accumulation - 1
                # Under DDP, gradients are all-reduced only on the last micro-batch.
                with nullcontext() if last else self.accelerator.no_sync(self.model):
                    loss = self._training_loss(batch) / self.gradient_accumulation
                    self.accelerator.backward(loss)
                step_loss = step_loss + loss.detach()
            if self._average_gradients and not self._alone:
                self._all_reduce_gradients()
            # Without clipping, an infinite max norm measures without changing anything.
            max_norm = self.max_grad_norm if self.max_grad_norm is not None else float("inf")
            grad_norm = self.accelerator.clip_grad_norm_(self.trainable_parameters, max_norm)
            if not self._finite(step_loss, grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                names = sorted({self._dataset_names[j] for j in datasets})
                if probing:
                    raise Diverged(f"a probe on {names[0]} reached a non-finite loss or gradient")
                self._skip_step(names)
                continue
            if not probing:
                self.main_steps += 1
            self.optimizer.step()
            # An fp16 step skipped for inf/NaN gradients must not advance the schedule.
            if not self.optimizer.step_was_skipped:
                self.lr_scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        return step_loss

    def _copy_tensors(self, tensors: list[Tensor]) -> list[Tensor]:
        """Detached copies of ``tensors``."""
        with torch.no_grad():
            copies = [torch.empty_like(t) for t in tensors]
            self._copy_into(copies, tensors)
        return copies

    def _copy_into(self, targets: list[Tensor], sources: list[Tensor]) -> None:
        """``targets[i].copy_(sources[i])`` for every i, with one multi-tensor kernel per
        device and dtype rather than one kernel per tensor. A snapshot + restore of
        Qwen2.5-0.5B's rank-32 LoRA adapter and its Adam moments (about a thousand tensors)
        took 33 ms on an H100 with a kernel per tensor, 17% of a training step, and 10.5 ms
        this way. Shards (FSDP2's DTensors) are copied one by one."""
        if self._sharded:
            for target, source in zip(targets, sources, strict=True):
                target.copy_(source)
        else:
            # The fast kernel needs one device and dtype per call (AdamW's step counters
            # live on the CPU beside moments on the GPU).
            groups: dict[tuple[Any, ...], tuple[list[Tensor], list[Tensor]]] = {}
            for target, source in zip(targets, sources, strict=True):
                key = (target.device, target.dtype, source.device, source.dtype)
                group = groups.setdefault(key, ([], []))
                group[0].append(target)
                group[1].append(source)
            for group_targets, group_sources in groups.values():
                torch._foreach_copy_(group_targets, group_sources)

    def _reshard(self) -> None:
        if self._sharded:
            _reshard_modules(self.model)

    def _all_reduce_gradients(self) -> None:
        """Average the gradients over the processes, as DDP does for a wrapped model (the
        Trainer hands callbacks its unwrapped model)."""
        for p in self.trainable_parameters:
            if p.grad is not None:
                p.grad = self.accelerator.reduce(p.grad, reduction="mean")

    def _finite(self, step_loss: Tensor, grad_norm: Tensor | float | None) -> bool:
        """Whether this step may be applied; the same answer on every rank."""
        loss = step_loss.reshape(1)
        if self.accelerator.num_processes > 1 and not self._alone:
            loss = self.accelerator.reduce(loss, reduction="sum")  # NaN on one rank: NaN everywhere
        ok = torch.isfinite(loss).all()
        # Under fp16 an infinite gradient is the loss scaler's overflow, which the scaler
        # itself skips and recovers from; the (all-reduced) norm is checked otherwise.
        if self.accelerator.scaler is None and grad_norm is not None:
            ok = ok & torch.isfinite(torch.as_tensor(grad_norm, device=ok.device)).all()
        return bool(ok)  # one host sync per step

    def _skip_step(self, datasets: list[str]) -> None:
        step = self.main_steps  # the number recorded, logged and reported alike
        self.skipped_steps.append({"step": step, "datasets": datasets})
        self.main_steps += 1
        logger.warning("step %d: non-finite loss or gradient on %s; the step is skipped", step, datasets)
        if len(self.skipped_steps) > self.max_skipped_steps:
            raise Diverged(
                f"training diverged: {len(self.skipped_steps)} steps had a non-finite loss or gradient "
                f"(the last at step {step}, on {', '.join(datasets)}), more than "
                f"training.max_skipped_steps={self.max_skipped_steps}: lower optimizer.lr, set "
                "optimizer.max_grad_norm, or use fp32 (training.mixed_precision: no), and start again"
            )

    def snapshot(self) -> TrainingSnapshot:
        """Copy the training state (trainable weights, optimizer, scheduler, RNG, sampler)."""
        states = [self.torch_optimizer.state.get(p) for p in self.trainable_parameters]
        # Every tensor copied at once (a LoRA adapter has hundreds of small ones).
        tensors = [p.detach() for p in self.trainable_parameters]
        tensors += [v for state in states if state for v in state.values() if isinstance(v, Tensor)]
        copies = iter(self._copy_tensors(tensors))
        parameters = [next(copies) for _ in self.trainable_parameters]
        optimizer_state: list[dict[str, Any] | None] = [
            None
            if not state
            else {
                k: next(copies) if isinstance(v, Tensor) else copy.deepcopy(v)
                for k, v in state.items()
            }
            for state in states
        ]
        scaler = self.accelerator.scaler
        return TrainingSnapshot(
            parameters=parameters,
            optimizer_state=optimizer_state,
            param_group_settings=[
                {k: v for k, v in group.items() if k != "params"}
                for group in self.torch_optimizer.param_groups
            ],
            lr_scheduler=copy.deepcopy(self.lr_scheduler.state_dict()),
            grad_scaler=None if scaler is None else copy.deepcopy(scaler.state_dict()),
            sampler=copy.deepcopy(self.sampler.state_dict()),
            rng=RNGState.capture(),
            main_steps=self.main_steps,
            skipped_steps=tuple(copy.deepcopy(self.skipped_steps)),
        )

    def restore(self, snapshot: TrainingSnapshot) -> None:
        """Return to ``snapshot`` by copying into the live tensors; ``snapshot`` stays valid.
        Under FSDP2 each rank copies its own shards."""
        self._reshard()
        # Collected first and copied at once, as in snapshot().
        targets: list[Tensor] = list(self.trainable_parameters)
        sources: list[Tensor] = list(snapshot.parameters)
        optimizer_state = self.torch_optimizer.state
        for p, saved_state in zip(self.trainable_parameters, snapshot.optimizer_state, strict=True):
            live = optimizer_state.get(p)
            if saved_state is None:
                # Adam had no moments for p at the snapshot (step 0): the probe's must go,
                # so the next real step initialises them exactly as it would have.
                optimizer_state.pop(p, None)
            elif not live:
                optimizer_state[p] = {k: _copy_value(v) for k, v in saved_state.items()}
            else:
                for key, value in saved_state.items():
                    if isinstance(value, Tensor):
                        targets.append(live[key])
                        sources.append(value)
                    else:
                        live[key] = copy.deepcopy(value)
        with torch.no_grad():
            self._copy_into(targets, sources)
        for group, settings in zip(
            self.torch_optimizer.param_groups, snapshot.param_group_settings, strict=True
        ):
            group.update(settings)
        # load_state_dict methods may keep (and later mutate) the objects they are given,
        # so they get copies and the snapshot can be restored again.
        self.lr_scheduler.load_state_dict(copy.deepcopy(snapshot.lr_scheduler))
        if snapshot.grad_scaler is not None:
            assert self.accelerator.scaler is not None
            self.accelerator.scaler.load_state_dict(copy.deepcopy(snapshot.grad_scaler))
        # Probe streams are not rolled back: the next probe of a dataset continues where the
        # last one stopped instead of re-reading the same batches at every update.
        sampler_state = copy.deepcopy(snapshot.sampler)
        sampler_state["probe_streams"] = copy.deepcopy(self.sampler.state_dict()["probe_streams"])
        self.sampler.load_state_dict(sampler_state)
        snapshot.rng.apply()
        self.main_steps = snapshot.main_steps
        self.skipped_steps = copy.deepcopy(list(snapshot.skipped_steps))

    def load_training_state(self, snapshot: TrainingSnapshot) -> None:
        """Resume from ``snapshot`` (read from disk): :meth:`restore`, and the probe streams'
        positions too, which a probe's rollback leaves where they are. Whole tensors (what
        :meth:`whole` gave to be saved) are cut into this rank's shards under sharding."""
        snapshot = self.sharded_like(snapshot)

        def next_to_parameter(value: Any, parameter: Tensor, key: str | None) -> Any:
            # Read from disk onto the CPU: moments go next to their parameters (restore copies
            # the parameters themselves); AdamW keeps its step counter on the CPU (it is not
            # capturable here).
            if key is None or key == "step" or not isinstance(value, Tensor):
                return value
            return value.to(parameter.device)

        self.restore(self._map_tensors(snapshot, next_to_parameter))
        self.sampler.load_state_dict(copy.deepcopy(snapshot.sampler))

    @property
    def sharded(self) -> bool:
        """Whether the trainable parameters are shards (FSDP2): each rank holds a part."""
        return self._sharded

    def whole(self, snapshot: TrainingSnapshot) -> TrainingSnapshot:
        """``snapshot`` with every shard gathered into its whole tensor on the CPU: what a
        run folder stores, the same files whatever the sharding. Under sharding every rank
        must call it, for the same snapshots in the same order; only the main process keeps
        the whole tensors (it alone writes), the others drop each one once gathered and get
        ``snapshot`` back. Unsharded, it returns ``snapshot`` itself."""
        if not self._sharded:
            return snapshot
        keep = self.accelerator.is_main_process

        def gather(value: Any, parameter: Tensor, key: str | None) -> Any:
            if not isinstance(value, DTensor):
                return value
            whole = value.full_tensor()  # a collective: every rank takes part
            return whole.cpu() if keep else value

        return self._map_tensors(snapshot, gather)

    def sharded_like(self, snapshot: TrainingSnapshot) -> TrainingSnapshot:
        """The inverse of :meth:`whole`: a snapshot of whole tensors (read from a run folder)
        cut into this rank's shards of the live parameters. Every rank calls it."""
        if not self._sharded:
            return snapshot

        def shard(value: Any, like: Tensor, key: str | None) -> Any:
            # AdamW's step counter is one number, never sharded.
            if key == "step" or not isinstance(like, DTensor) or not isinstance(value, Tensor):
                return value
            if isinstance(value, DTensor):
                return value
            return distribute_tensor(value.to(like.device, like.dtype), like.device_mesh, like.placements)

        return self._map_tensors(snapshot, shard)

    def _map_tensors(
        self, snapshot: TrainingSnapshot, f: Callable[[Any, Tensor, str | None], Any]
    ) -> TrainingSnapshot:
        """``snapshot`` with ``f(value, parameter, key)`` applied to each saved parameter (key
        None) and each value of its optimizer state (key: the state's name), ``parameter``
        being the live trainable parameter it belongs to."""
        parameters = self.trainable_parameters
        return dataclasses.replace(
            snapshot,
            parameters=[f(t, p, None) for t, p in zip(snapshot.parameters, parameters, strict=True)],
            optimizer_state=[
                None if state is None else {k: f(v, p, k) for k, v in state.items()}
                for state, p in zip(snapshot.optimizer_state, parameters, strict=True)
            ],
        )

    def whole_model_state(self) -> dict[str, Tensor] | None:
        """Under sharding, the model's whole state dict on the CPU (rank 0's copy; every
        rank must call it), for saving it as one model; None when not sharded (the model's
        own ``state_dict`` is whole)."""
        if not self._sharded:
            return None
        # A LoRA adapter is saved alone: the frozen base weights are not gathered at all.
        unwrapped = self.accelerator.unwrap_model(self.model)
        options = StateDictOptions(
            full_state_dict=True, cpu_offload=True, ignore_frozen_params=isinstance(unwrapped, PeftModel)
        )
        return cast(
            dict[str, Tensor],
            get_model_state_dict(unwrapped, options=options),
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
        batches = [self._split_batches(domain, split) for domain in self.domains]
        available = len(batches[0])
        count = available if num_batches is None else num_batches
        if not 1 <= count <= available:
            raise ValueError(
                f"num_batches={num_batches} outside [1, {available}] for split {split!r}"
            )
        # A process probing on its own evaluates every batch itself.
        world = 1 if self._alone else self.accelerator.num_processes
        mine = range(self.accelerator.process_index if world > 1 else 0, count, world)
        evaluated = list(mine)
        if self._sharded and world > 1:
            # A sharded forward gathers parameters from every rank, so all ranks run the
            # same number of forwards: the ranks with one batch fewer evaluate batch 0
            # again and drop it.
            evaluated += [0] * (-(-count // world) - len(evaluated))
        # The module itself, not its DDP wrapper: ranks evaluate different numbers of
        # batches, and a wrapper's forward may synchronise buffers across ranks.
        model = self.accelerator.unwrap_model(self.model) if self.accelerator.num_processes > 1 else self.model
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                values = torch.stack(
                    [
                        torch.stack([self._batch_metric(domain, domain_batches[b], model) for b in evaluated])
                        .double()[: len(mine)]
                        if evaluated
                        else torch.zeros(0, dtype=torch.float64, device=self.accelerator.device)
                        for domain, domain_batches in zip(self.domains, batches, strict=True)
                    ]
                )
        finally:
            self.model.train(was_training)
            self._reshard()
        if world > 1:
            values = self._gather_batches(values, count)
        # One device-to-host copy for the whole evaluation instead of one sync per batch.
        return Evaluation(values.cpu().numpy())

    def _gather_batches(self, local: Tensor, count: int) -> Tensor:
        """The (M, count) array from each rank's (M, its share) columns (rank r holds batches
        r, r + P, r + 2P, ...)."""
        world = self.accelerator.num_processes
        width = -(-count // world)
        padded = torch.zeros((local.shape[0], width), dtype=local.dtype, device=local.device)
        padded[:, : local.shape[1]] = local
        gathered = self.accelerator.gather(padded.unsqueeze(0))  # (P, M, width)
        full = torch.empty((local.shape[0], count), dtype=local.dtype, device=local.device)
        for rank in range(world):
            full[:, rank::world] = gathered[rank, :, : len(range(rank, count, world))]
        return full

    # --- gradient alignment (appendix K) ----------------------------------------------

    def alignment_slopes(self, num_batches: int) -> np.ndarray:
        """Gradient-alignment slope matrix ``S_ij = -lr * <g_i, d_j>``, shape (M, N), in
        metric units per optimizer step.

        - ``g_i``: mean gradient of domain i's metric over its first ``num_batches`` eval
          batches. Accuracy is piecewise constant, so accuracy domains use the
          cross-entropy of the answer among the choice letters' logits (the softmax
          version of letter-restricted argmax) as a differentiable stand-in for
          ``-accuracy``.
        - ``d_j``: the bias-corrected Adam direction ``m_hat / (sqrt(v_hat) + eps)`` that one
          Adam step on ``g_j`` would take from the current optimizer state, ``g_j`` being
          the mean training-loss gradient over ``num_batches`` batches the sampler draws
          with one-hot weights on dataset j (see :func:`adam_direction`). Decoupled weight
          decay is not part of the paper's direction and is left out.
        - ``lr``: the current learning rate of each parameter's group.

        Gradients are computed as a training step computes them (train mode: dropout and
        gradient checkpointing active). The sampler and RNG are restored afterwards, so
        the training state is unchanged. Memory: N + 2 copies of the trainable parameters.
        """
        if num_batches < 1:
            raise ValueError(f"num_batches must be >= 1, got {num_batches}")
        available = len(self.domains[0].eval_batches)
        if num_batches > available:
            raise ValueError(
                f"num_batches={num_batches} exceeds the {available} eval batches per domain"
            )
        sampler_state = copy.deepcopy(self.sampler.state_dict())
        rng = RNGState.capture()
        was_training = self.model.training
        self.model.train()
        try:
            directions = []
            for j in range(len(self._dataset_names)):
                one_hot = np.eye(len(self._dataset_names))[j]
                batches = (self.sampler.next_batch(one_hot)[1] for _ in range(num_batches))
                gradient = self._mean_gradient(batches, num_batches, self._language_model_loss)
                directions.append(
                    adam_direction(gradient, self.trainable_parameters, self.torch_optimizer)
                )
            learning_rates = _parameter_learning_rates(
                self.trainable_parameters, self.torch_optimizer
            )
            slopes = np.zeros((len(self.domains), len(directions)))
            for i, domain in enumerate(self.domains):
                loss_fn = (
                    self._language_model_loss if domain.metric == "loss" else self._choice_loss
                )
                gradient = self._mean_gradient(
                    domain.eval_batches[:num_batches], num_batches, loss_fn
                )
                for j, direction in enumerate(directions):
                    inner = torch.stack(
                        [
                            lr * torch.sum(g * d)
                            for lr, g, d in zip(learning_rates, gradient, direction, strict=True)
                        ]
                    ).sum()
                    slopes[i, j] = -float(inner)
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            self.model.train(was_training)
            self.sampler.load_state_dict(sampler_state)
            rng.apply()
        return slopes

    # --- internals ---------------------------------------------------------------------

    def _mean_gradient(self, batches: Iterable[Batch], count: int, loss_fn: Any) -> list[Tensor]:
        """Mean gradient of ``loss_fn`` over ``count`` batches, one tensor per trainable
        parameter (unscaled when fp16 loss scaling is on). Leaves ``.grad`` cleared."""
        self.optimizer.zero_grad(set_to_none=True)
        for k, batch in enumerate(batches):
            with nullcontext() if k == count - 1 else self.accelerator.no_sync(self.model):
                self.accelerator.backward(loss_fn(batch) / count)
        scaler = self.accelerator.scaler
        inverse_scale = 1.0 if scaler is None else 1.0 / scaler.get_scale()
        gradient = [
            torch.zeros_like(p) if p.grad is None else p.grad.detach() * inverse_scale
            for p in self.trainable_parameters
        ]
        self.optimizer.zero_grad(set_to_none=True)
        return gradient

    def _to_device(self, batch: Batch) -> dict[str, Tensor]:
        return {key: value.to(self.accelerator.device) for key, value in batch.items()}

    def _language_model_loss(self, batch: Batch, model: nn.Module | None = None) -> Tensor:
        """Mean next-token cross-entropy over the unmasked label tokens (HF's own shift)."""
        batch = self._to_device(batch)
        output = (self.model if model is None else model)(**model_inputs(batch), labels=batch["labels"])
        loss: Tensor = output.loss
        return loss.float()

    def _training_loss(self, batch: Batch) -> Tensor:
        """The training loss of this process's slice of a global batch.

        With one process it is the mean token loss. With several, each rank's slice holds
        a different number of loss tokens, and DDP averages the ranks' gradients: scaling
        each rank's token-loss *sum* by ``world_size / global_tokens`` makes that average
        exactly the gradient of the global batch's mean token loss, as one process with
        the whole batch would compute it.
        """
        world_size = self.accelerator.num_processes
        if world_size == 1:
            return self._language_model_loss(batch)
        batch = self._to_device(batch)
        local_tokens = (batch["labels"][:, 1:] != IGNORE_INDEX).sum()
        global_tokens = self.accelerator.reduce(local_tokens, reduction="sum")
        output = self.model(**model_inputs(batch), labels=batch["labels"], num_items_in_batch=global_tokens)
        loss: Tensor = output.loss.float() * world_size
        return loss

    def _backward_alone(self, slices: Sequence[Batch]) -> Tensor:
        """Backward one micro-batch of a probe this process runs on its own: the global
        batch's per-process ``slices`` in turn on the unwrapped module, each slice's token
        loss summed over the global batch's loss tokens, so the accumulated gradient is that
        of the global batch's mean token loss, as all processes together compute it."""
        model = self.accelerator.unwrap_model(self.model)
        batches = [self._to_device(batch) for batch in slices]
        tokens = torch.stack([(b["labels"][:, 1:] != IGNORE_INDEX).sum() for b in batches]).sum()
        total = torch.zeros((), device=self.accelerator.device)
        for batch in batches:
            output = model(**model_inputs(batch), labels=batch["labels"], num_items_in_batch=tokens)
            loss = output.loss.float() / self.gradient_accumulation
            self.accelerator.backward(loss)
            total = total + loss.detach()
        return total

    def _choice_loss(self, batch: Batch) -> Tensor:
        """Cross-entropy of the correct letter among the choice letters' logits."""
        batch = self._to_device(batch)
        return F.cross_entropy(choice_logits(self.model, batch), batch["answer_index"])

    def _batch_metric(self, domain: EvaluationDomain, batch: Batch, model: nn.Module) -> Tensor:
        if domain.metric == "loss":
            return self._language_model_loss(batch, model)
        batch = self._to_device(batch)
        predicted = choice_logits(model, batch).argmax(dim=-1)
        # float64: k/n exactly rounded, where float32 made 63/72 right read as 0.87499999.
        return -(predicted == batch["answer_index"]).double().mean()

    def _split_batches(self, domain: EvaluationDomain, split: str) -> Sequence[Batch]:
        if split == "eval":
            return domain.eval_batches
        if split == "test":
            return domain.test_batches
        raise ValueError(f"split must be 'eval' or 'test', got {split!r}")


def _reshard_modules(model: nn.Module) -> None:
    """Free FSDP2's gathered parameters. A forward without backward (an evaluation) leaves
    the root module's gathered, and a later forward would use them even after the shards
    changed (a restore); gathering afresh reads the shards."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _is_sharded(parameters: Sequence[nn.Parameter]) -> bool:
    """Whether the parameters are shards (FSDP2's DTensors): each rank holds a part."""
    return any(isinstance(p, DTensor) for p in parameters)


def choice_logits(model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
    """Logits of the K choice letters at each prompt's last real token, shape (B, K)
    (letter-restricted scoring, appendix M). Prompts are right-padded."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    last = batch["attention_mask"].sum(dim=1) - 1
    next_token_logits = logits[torch.arange(logits.shape[0], device=logits.device), last]
    return next_token_logits.float().gather(1, batch["choice_token_ids"])


def adam_direction(
    gradient: Sequence[Tensor], parameters: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer
) -> list[Tensor]:
    """The bias-corrected Adam direction ``d = m_hat / (sqrt(v_hat) + eps)`` of one Adam step
    on ``gradient`` from ``optimizer``'s current state (appendix K, eq. grad_align_slope):

        m = b1 * m + (1 - b1) * g,    v = b2 * v + (1 - b2) * g^2,    t = step + 1,
        m_hat = m / (1 - b1^t),       v_hat = v / (1 - b2^t),

    with m = v = 0 and step = 0 for parameters Adam has not initialised yet. The step the
    optimizer would take is ``-lr * d`` (plus decoupled weight decay). The optimizer state
    is only read.
    """
    group_of = {p: group for group in optimizer.param_groups for p in group["params"]}
    direction = []
    for p, g in zip(parameters, gradient, strict=True):
        group = group_of[p]
        beta1, beta2 = group["betas"]
        state = optimizer.state.get(p)
        if state:
            m = beta1 * state["exp_avg"] + (1 - beta1) * g
            v = beta2 * state["exp_avg_sq"] + (1 - beta2) * g * g
            t = float(state["step"]) + 1
        else:
            m = (1 - beta1) * g
            v = (1 - beta2) * g * g
            t = 1.0
        m_hat = m / (1 - beta1**t)
        v_hat = v / (1 - beta2**t)
        direction.append(m_hat / (v_hat.sqrt() + group["eps"]))
    return direction


def _parameter_learning_rates(
    parameters: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer
) -> list[float]:
    lr_of = {p: float(group["lr"]) for group in optimizer.param_groups for p in group["params"]}
    return [lr_of[p] for p in parameters]


def _copy_value(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, Tensor) else copy.deepcopy(value)


def _check_domains(domains: Sequence[EvaluationDomain]) -> None:
    if not domains:
        raise ValueError("domains is empty: the learner needs at least one evaluation domain")
    for split in ("eval", "test"):
        counts = {
            domain.name: len(domain.eval_batches if split == "eval" else domain.test_batches)
            for domain in domains
        }
        if min(counts.values()) < 1 or len(set(counts.values())) > 1:
            raise ValueError(
                f"every domain needs the same number (>= 1) of {split} batches, got {counts}; "
                "the data layer should repeat the batches of small domains"
            )
    for domain in domains:
        if domain.metric not in ("loss", "accuracy"):
            raise ValueError(
                f"domain {domain.name!r}: metric must be 'loss' or 'accuracy', got {domain.metric!r}"
            )

"""The training state a probe may change, its in-memory snapshots, and their files.

Public API:

- ``RNGState``: every random number generator a training step may draw from.
- ``TrainingSnapshot``: an in-memory copy of everything a training step changes.
- ``save_snapshot(snapshot, folder, name)`` / ``load_snapshot(folder, name)``: a snapshot
  as ``name.safetensors`` and ``name.json`` (nothing pickled).
- ``save_rng_state(rng, folder, name)`` / ``load_rng_state(folder, name)``: one process's
  RNG state alone, in the same two files (a resume point keeps one per rank).
- ``TrainingState``: the live model, optimizer, LR scheduler, sampler and step counters,
  with ``snapshot``/``restore`` (the paper's probe rollback), ``load`` (a resume), and,
  under sharding (FSDP2), ``gathered``/``cut_into_shards`` between shards and whole tensors.
- ``prepared_training_state(...)``: the state of AdamW and its LR schedule built for a model,
  both prepared by the accelerator (the engine's own loop).
- ``adopted_training_state(...)``: the state of another loop's model, optimizer and
  scheduler (a transformers ``Trainer``'s).
- ``reshard_modules(model)``, ``is_sharded(parameters)``: FSDP2 helpers.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import safetensors.torch
import torch
from accelerate import Accelerator
from peft import PeftModel
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

from dynamics.engine.config import OptimizerConfig
from dynamics.engine.data_contracts import BatchSampler
from dynamics.engine.model import build_lr_scheduler, build_optimizer, trainable_parameters


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
            return {
                "__items__": [
                    [_to_json(k, tensors), _to_json(v, tensors)] for k, v in value.items()
                ]
            }
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
            "rng": _rng_fields(snapshot.rng),
        },
        tensors,
    )
    _write(folder, name, tensors, meta)


def _rng_fields(rng: RNGState) -> dict[str, Any]:
    return {
        "torch_cpu": rng.torch_cpu,
        "torch_cuda": rng.torch_cuda,
        "python": rng.python,
        "numpy": rng.numpy,
    }


def _rng_from_fields(fields: Mapping[str, Any]) -> RNGState:
    return RNGState(
        torch_cpu=fields["torch_cpu"],
        torch_cuda=fields["torch_cuda"],
        python=fields["python"],
        numpy=fields["numpy"],
    )


def _write(folder: Path, name: str, tensors: dict[str, Tensor], meta: Any) -> None:
    safetensors.torch.save_file(tensors, str(folder / f"{name}.safetensors"))
    (folder / f"{name}.json").write_text(json.dumps(meta, allow_nan=False))


def _read(folder: Path, name: str) -> Any:
    tensors = safetensors.torch.load_file(str(folder / f"{name}.safetensors"))
    return _from_json(json.loads((folder / f"{name}.json").read_text()), tensors)


def save_rng_state(rng: RNGState, folder: Path, name: str) -> None:
    """Write one process's ``rng`` as ``name.safetensors`` (torch's states) and ``name.json``
    (python's and numpy's)."""
    tensors: dict[str, Tensor] = {}
    meta = _to_json(_rng_fields(rng), tensors)
    _write(folder, name, tensors, meta)


def load_rng_state(folder: Path, name: str) -> RNGState:
    """Read what :func:`save_rng_state` wrote (nothing unpickled)."""
    return _rng_from_fields(_read(folder, name))


def load_snapshot(folder: Path, name: str) -> TrainingSnapshot:
    """Read what :func:`save_snapshot` wrote (safetensors and JSON only: nothing unpickled)."""
    data = _read(folder, name)
    return TrainingSnapshot(
        parameters=data["parameters"],
        optimizer_state=data["optimizer_state"],
        param_group_settings=data["param_group_settings"],
        lr_scheduler=data["lr_scheduler"],
        grad_scaler=data["grad_scaler"],
        sampler=data["sampler"],
        rng=_rng_from_fields(data["rng"]),
        main_steps=int(data["main_steps"]),
        skipped_steps=tuple(data["skipped_steps"]),
    )


class TrainingState:
    """The live state a training step changes: the trainable parameters of ``model``, the
    optimizer and its torch optimizer's state and hyper-parameters, the LR scheduler, the
    grad scaler (fp16), the RNGs, the sampler, and the main run's step counters.

    ``optimizer`` is accelerate's wrapper of ``torch_optimizer``, which holds the state that
    snapshots copy; ``trainable_parameters`` are the live (under FSDP2, sharded) parameters
    that ``torch_optimizer`` updates.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: Any,
        torch_optimizer: torch.optim.Optimizer,
        lr_scheduler: Any,
        sampler: BatchSampler,
        accelerator: Accelerator,
        trainable_parameters: list[nn.Parameter],
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.torch_optimizer = torch_optimizer
        self.lr_scheduler = lr_scheduler
        self.sampler = sampler
        self.accelerator = accelerator
        self.trainable_parameters = trainable_parameters
        self.sharded = is_sharded(trainable_parameters)
        """Whether the trainable parameters are shards (FSDP2): each rank holds a part."""
        self.main_steps = 0
        """Main-run optimizer steps taken, skipped ones included."""
        self.skipped_steps: list[dict[str, Any]] = []
        """Main-run steps skipped for a non-finite loss or gradient: step and datasets."""

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
        self.reshard()
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
        self._restore_schedule(snapshot)
        # Probe streams are not rolled back: the next probe of a dataset continues where the
        # last one stopped instead of re-reading the same batches at every update.
        sampler_state = copy.deepcopy(snapshot.sampler)
        sampler_state["probe_streams"] = copy.deepcopy(self.sampler.state_dict()["probe_streams"])
        self.sampler.load_state_dict(sampler_state)
        snapshot.rng.apply()
        self.main_steps = snapshot.main_steps
        self.skipped_steps = copy.deepcopy(list(snapshot.skipped_steps))

    def _restore_schedule(self, snapshot: TrainingSnapshot) -> None:
        """The param groups' settings, the LR scheduler and the grad scaler of ``snapshot``."""
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

    def load(self, snapshot: TrainingSnapshot) -> None:
        """Resume from ``snapshot`` (read from disk): :meth:`restore`, and the probe streams'
        positions too, which a probe's rollback leaves where they are. Whole tensors (what
        :meth:`gathered` gave to be saved) are cut into this rank's shards under sharding."""
        snapshot = self.cut_into_shards(snapshot)

        def next_to_parameter(value: Any, parameter: Tensor, key: str | None) -> Any:
            # Read from disk onto the CPU: moments go next to their parameters (restore copies
            # the parameters themselves); AdamW keeps its step counter on the CPU (it is not
            # capturable here).
            if key is None or key == "step" or not isinstance(value, Tensor):
                return value
            return value.to(parameter.device)

        self.restore(self._map_tensors(snapshot, next_to_parameter))
        self.sampler.load_state_dict(copy.deepcopy(snapshot.sampler))

    def gathered(self, snapshot: TrainingSnapshot) -> TrainingSnapshot:
        """``snapshot`` with every shard gathered into its whole tensor on the CPU: what a
        run folder stores, the same files whatever the sharding. Under sharding every rank
        must call it, for the same snapshots in the same order; only the main process keeps
        the whole tensors (it alone writes), the others drop each one once gathered and get
        ``snapshot`` back. Unsharded, it returns ``snapshot`` itself."""
        if not self.sharded:
            return snapshot
        keep = self.accelerator.is_main_process

        def gather(value: Any, parameter: Tensor, key: str | None) -> Any:
            if not isinstance(value, DTensor):
                return value
            whole = value.full_tensor()  # a collective: every rank takes part
            return whole.cpu() if keep else value

        return self._map_tensors(snapshot, gather)

    def cut_into_shards(self, snapshot: TrainingSnapshot) -> TrainingSnapshot:
        """The inverse of :meth:`gathered`: a snapshot of whole tensors (read from a run folder)
        cut into this rank's shards of the live parameters. Every rank calls it."""
        if not self.sharded:
            return snapshot

        def shard(value: Any, like: Tensor, key: str | None) -> Any:
            # AdamW's step counter is one number, never sharded.
            if key == "step" or not isinstance(like, DTensor) or not isinstance(value, Tensor):
                return value
            if isinstance(value, DTensor):
                return value
            return distribute_tensor(
                value.to(like.device, like.dtype), like.device_mesh, like.placements
            )

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
            parameters=[
                f(t, p, None) for t, p in zip(snapshot.parameters, parameters, strict=True)
            ],
            optimizer_state=[
                None if state is None else {k: f(v, p, k) for k, v in state.items()}
                for state, p in zip(snapshot.optimizer_state, parameters, strict=True)
            ],
        )

    def gathered_model_state(self) -> dict[str, Tensor] | None:
        """Under sharding, the model's whole state dict on the CPU (rank 0's copy; every
        rank must call it), for saving it as one model; None when not sharded (the model's
        own ``state_dict`` is whole)."""
        if not self.sharded:
            return None
        # A LoRA adapter is saved alone: the frozen base weights are not gathered at all.
        unwrapped = self.accelerator.unwrap_model(self.model)
        options = StateDictOptions(
            full_state_dict=True,
            cpu_offload=True,
            ignore_frozen_params=isinstance(unwrapped, PeftModel),
        )
        return cast(
            dict[str, Tensor],
            get_model_state_dict(unwrapped, options=options),
        )

    def reshard(self) -> None:
        """Under sharding, free the parameters a forward gathered (see :func:`reshard_modules`)."""
        if self.sharded:
            reshard_modules(self.model)

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
        if self.sharded:
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


def prepared_training_state(
    model: nn.Module,
    sampler: BatchSampler,
    config: OptimizerConfig,
    total_steps: int,
    accelerator: Accelerator,
) -> TrainingState:
    """AdamW and its LR schedule built for ``model``, and both prepared by ``accelerator``."""
    if accelerator.gradient_accumulation_steps != 1:
        # The learner accumulates itself (mixture draws per micro-batch); accelerate's own
        # accumulation would divide the loss a second time and skip optimizer steps.
        raise ValueError(
            "pass gradient_accumulation to HFLearner and leave the Accelerator's "
            f"gradient_accumulation_steps at 1 (got {accelerator.gradient_accumulation_steps})"
        )
    # The raw torch optimizer and scheduler hold the state that snapshots copy; the
    # accelerator's wrapper adds device placement and fp16 loss scaling. The scheduler is
    # deliberately not handed to ``prepare``: accelerate would step it once per process,
    # while our schedule counts optimizer steps.
    torch_optimizer = build_optimizer(trainable_parameters(model), config)
    lr_scheduler = build_lr_scheduler(torch_optimizer, config, total_steps)
    prepared_model, optimizer = accelerator.prepare(model, torch_optimizer)
    # Sharding (FSDP) replaces the parameters, and prepare points the optimizer at the
    # new ones: those are what is trained, snapshotted and restored.
    parameters = [p for group in torch_optimizer.param_groups for p in group["params"]]
    prepared_model.train()
    return TrainingState(
        prepared_model, optimizer, torch_optimizer, lr_scheduler, sampler, accelerator, parameters
    )


def adopted_training_state(
    model: nn.Module,
    sampler: BatchSampler,
    optimizer: Any,
    lr_scheduler: Any,
    accelerator: Accelerator,
) -> TrainingState:
    """The training state on another loop's ``model``, ``optimizer`` and ``lr_scheduler``, as
    that loop prepared them; ``optimizer`` is accelerate's wrapper or a torch optimizer,
    which ``accelerator`` then wraps."""
    parameters = trainable_parameters(model)
    torch_optimizer = getattr(optimizer, "optimizer", optimizer)
    if not hasattr(optimizer, "step_was_skipped"):
        optimizer = accelerator.prepare_optimizer(optimizer)
    return TrainingState(
        model, optimizer, torch_optimizer, lr_scheduler, sampler, accelerator, parameters
    )


def reshard_modules(model: nn.Module) -> None:
    """Free FSDP2's gathered parameters. A forward without backward (an evaluation) leaves
    the root module's gathered, and a later forward would use them even after the shards
    changed (a restore); gathering afresh reads the shards."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def is_sharded(parameters: Sequence[nn.Parameter]) -> bool:
    """Whether the parameters are shards (FSDP2's DTensors): each rank holds a part."""
    return any(isinstance(p, DTensor) for p in parameters)


def _copy_value(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, Tensor) else copy.deepcopy(value)

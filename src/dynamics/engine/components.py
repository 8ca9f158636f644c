"""The parts of a run, set up from its config: the mixture policy (:func:`build_policy`),
and the model, data (``dynamics.engine.run_data``), learner and policy together
(:func:`build_run`, the one function here that reads the whole config); and what keeps
several processes in step while a run starts (:func:`agree_on_refusal`) and trains
(:class:`RankSlicedSampler`, :class:`BroadcastPolicy`). Both drivers, ``dynamics run`` and
the Trainer callback, build from here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import datasets
import numpy as np
import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import broadcast_object_list, gather_object, set_seed
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dynamics.core.learner import Learner
from dynamics.core.policy_interface import MixturePolicy, UpdateContext
from dynamics.core.policy_registry import POLICIES, PolicySettings
from dynamics.core.probes import PerturbedEvaluations
from dynamics.core.problem import SolverGrid
from dynamics.core.records import UpdateRecord
from dynamics.core.schedules import UpdateSchedule
from dynamics.core.shares import MixtureUnit
from dynamics.data.loading import DataError
from dynamics.engine.batches import Batch
from dynamics.engine.config import RunConfig
from dynamics.engine.launch import world_size
from dynamics.engine.learner import HFLearner
from dynamics.engine.model import load_causal_lm, load_tokenizer, prepare_model
from dynamics.engine.preflight import RunSetupError
from dynamics.engine.run_data import RunData, build_data
from dynamics.engine.sampler import MixtureSampler
from dynamics.runs import rundir

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Bad input found while a run starts: one line for the user (the CLI's exit code 2).
REFUSALS = (RunSetupError, rundir.RunDirError, DataError)


def agree_on_refusal(error: Exception | None) -> None:
    """Stop every rank when any rank stopped: each rank's outcome of a setup step (``error``
    None when it succeeded) is gathered from all ranks; a rank that failed raises its own
    error, the others raise the first failed rank's (a refusal as the same one line). Every
    rank must call this at the same point; under one process it just raises ``error``."""
    if world_size() == 1:
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


def attempt(step: Callable[[], T]) -> tuple[T | None, Exception | None]:
    """``step()``'s result and no error, or no result and the error it raised (for
    :func:`agree_on_refusal`, which every rank calls with its outcome)."""
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
class RunComponents:
    """Everything a run trains with, set up from its config: the accelerator, tokenizer,
    model, learner and policy, and which evaluation domains are targets and constraints."""

    config: RunConfig
    accelerator: Accelerator
    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module
    learner: HFLearner
    policy: MixturePolicy
    targets: tuple[int, ...]
    constraints: tuple[int, ...]
    domain_metrics: list[str]


def controlled_learner(learner: Learner, relative_noise: float, noise_seed: int) -> Learner:
    """The learner the controller drives: ``learner``, or with ``evaluation.relative_noise``
    its evaluations perturbed (a sensitivity check, seeded by ``evaluation.noise_seed``)."""
    if relative_noise > 0:
        return PerturbedEvaluations(learner, relative_noise, noise_seed)
    return learner


def build_policy(config: RunConfig, dataset_names: list[str], unit: MixtureUnit) -> MixturePolicy:
    """The policy of ``config.method`` over ``dataset_names``, recording its weights in
    ``unit``, the sampler's (:attr:`MixtureSampler.unit`)."""
    method = config.method
    settings = PolicySettings(
        dataset_names=dataset_names,
        total_steps=config.training.total_steps,
        unit=unit,
        schedule=method.schedule,
        probe_cap=method.probe_cap,
        probe_min=method.probe_min,
        grid=SolverGrid(
            lambdas=tuple(method.grid.lambdas) if method.grid.lambdas else SolverGrid().lambdas,
            epsilons=tuple(method.grid.epsilons)
            if method.grid.epsilons is not None
            else SolverGrid().epsilons,
        ),
        predictor=method.predictor,
        rules=method.rules(),
        min_weight=method.floors.all,
        weights=method.weights,
        alignment_batches=method.alignment_batches,
    )
    try:
        return POLICIES[method.name].from_settings(settings)
    except ValueError as err:  # what the config alone cannot see: token shares' batch shares
        raise RunSetupError(str(err)) from None


def build_run(
    config: RunConfig,
    accelerator: Accelerator | None = None,
    *,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    data: Mapping[str, datasets.Dataset] | None = None,
) -> RunComponents:
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
        raise RunSetupError(
            "pass model= and tokenizer= together (the model's own tokenizer), or neither"
        )
    if tokenizer is None:
        tokenizer = load_tokenizer(config.model)
    base_model = model if model is not None else load_causal_lm(config.model)
    vocab = int(base_model.config.vocab_size)
    if len(tokenizer) > vocab:
        raise RunSetupError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's embedding has {vocab}: "
            "use the model's own tokenizer (model.tokenizer) or a larger vocab_size in "
            "model.init_config"
        )
    trained = prepare_model(base_model, config.lora, training.gradient_checkpointing)
    run_data = _first_on_each_machine(
        accelerator,
        lambda: build_data(
            config.datasets,
            training,
            config.evaluation,
            tokenizer,
            accelerator.num_processes,
            data,
        ),
    )
    mixture_sampler = MixtureSampler(
        run_data.streams, seed=training.seed, sampling=training.sampling
    )
    sampler = RankSlicedSampler(
        mixture_sampler, accelerator.process_index, accelerator.num_processes
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
    policy: MixturePolicy = BroadcastPolicy(
        build_policy(config, run_data.dataset_names, mixture_sampler.unit), accelerator
    )
    return RunComponents(
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


def _first_on_each_machine(accelerator: Accelerator, load: Callable[[], RunData]) -> RunData:
    """``load()`` on the first process of each machine, then on the others. The first loads
    and tokenizes into datasets' cache; the others then read the cached tokens
    (dynamics.data.formatting.tokenize_rows). A refusal of the data found by the first
    reaches the others, which would otherwise wait for it forever."""
    first = accelerator.is_local_main_process
    run_data, error = attempt(load) if first else (None, None)
    agree_on_refusal(error)
    if not first:
        run_data, error = attempt(load)
    agree_on_refusal(error)
    assert run_data is not None  # else agree_on_refusal raised
    return run_data

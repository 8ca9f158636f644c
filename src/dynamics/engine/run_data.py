"""The tokenized data of a run, built from its datasets and the training and evaluation
settings (:func:`build_data`): the training streams the mixture draws from and the fixed
evaluation batches of every target and constraint. Both drivers, ``dynamics run`` and the
Trainer callback, build their data here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import datasets
from transformers import PreTrainedTokenizerBase

from dynamics.data.formatting import LMExample, pad_token_id
from dynamics.data.splits import prepare_examples
from dynamics.engine.batches import EvalBatches
from dynamics.engine.config import DatasetConfig, EvaluationConfig, TrainingConfig
from dynamics.engine.preflight import RunSetupError
from dynamics.engine.sampler import DatasetStream


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
    dataset_configs: Sequence[DatasetConfig],
    training: TrainingConfig,
    evaluation: EvaluationConfig,
    tokenizer: PreTrainedTokenizerBase,
    world: int = 1,
    data: Mapping[str, datasets.Dataset] | None = None,
) -> RunData:
    """Tokenize and split every dataset of ``dataset_configs`` (a run config's ``datasets``,
    in their order; ``data[name]`` holds rows passed in Python); ``world`` processes share
    each global training batch (the streams draw batches of ``batch_size * world`` rows)."""
    data = data or {}
    order = DomainOrder.of(dataset_configs)
    pad_id = pad_token_id(tokenizer)
    eval_batch_size = evaluation.batch_size or training.batch_size
    streams: list[DatasetStream] = []
    trained: list[str] = []
    domains: dict[str, EvalBatches] = {}
    for index, dataset in enumerate(dataset_configs):
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
                    f"dataset {dataset.name!r} has no training examples left after the eval/test "
                    "split: add rows or lower its eval_size/test_size"
                )
            streams.append(
                DatasetStream(
                    train_examples,
                    batch_size=training.batch_size * world,
                    pad_id=pad_id,
                    seed=training.seed * 1000 + index,
                )
            )
            trained.append(dataset.name)
        if dataset.role in ("target", "constraint"):
            domains[dataset.name] = EvalBatches.build(
                dataset.name,
                parts.eval,
                parts.test,
                num_batches=evaluation.batches,
                batch_size=dataset.eval_batch_size or eval_batch_size,
                pad_id=pad_id,
                seed=training.data_seed + 7919 * (index + 1),
            )
    domain_list = [domains[name] for name in order.names]
    for name, metric, built in zip(order.names, order.metrics, domain_list, strict=True):
        if built.metric != metric:
            raise RunSetupError(
                f"dataset {name!r}: metric {metric!r} does not fit its rows ({built.metric})"
            )
    return RunData(
        streams=streams,
        dataset_names=trained,
        domains=domain_list,
        targets=tuple(range(order.num_targets)),
        constraints=tuple(range(order.num_targets, len(order.names))),
        domain_metrics=list(order.metrics),
    )


@dataclass(frozen=True)
class DomainOrder:
    """The evaluation domains in the slope matrix's row order, the targets first, then the
    constraints (``RunConfig.evaluation_domains``): their names and metrics."""

    names: tuple[str, ...]
    metrics: tuple[str, ...]
    num_targets: int

    @classmethod
    def of(cls, dataset_configs: Sequence[DatasetConfig]) -> DomainOrder:
        targets = [d for d in dataset_configs if d.role == "target"]
        ordered = targets + [d for d in dataset_configs if d.role == "constraint"]
        return cls(
            names=tuple(d.name for d in ordered),
            metrics=tuple(d.metric for d in ordered),
            num_targets=len(targets),
        )

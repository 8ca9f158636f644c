"""Run as the ranks of a gloo group on the CPU (torchrun's environment variables): the
learner on a tiny model sharded with FSDP2 (``fully_shard``, one shard per rank), or
unsharded in one process for reference.

Writes ``{out}/rank{r}.json`` with evaluations taken around a probe and its rollback, so
the test can check that restoring a snapshot is exact under sharding and that sharded
training and evaluation follow one process's; and, from rank 0, the whole training state
(``whole.*``) and model state (``model.safetensors``, sharded runs only) gathered from the
shards, which every rank then reads back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import yaml
from accelerate import Accelerator
from accelerate.utils import set_seed
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from dynamics.engine.components import RankSlicedSampler
from dynamics.engine.config import RunConfig
from dynamics.engine.learner import HFLearner, load_snapshot, save_snapshot
from dynamics.engine.model import (
    build_lr_scheduler,
    build_optimizer,
    load_causal_lm,
    load_tokenizer,
    prepare_model,
    trainable_parameters,
)
from dynamics.engine.run_data import RunData, build_data
from dynamics.engine.sampler import MixtureSampler


def sharded_learner(config: RunConfig, accelerator: Accelerator, data: RunData) -> HFLearner:
    """A learner on a fresh model (sharded over the processes) with a fresh optimizer."""
    world, rank = accelerator.num_processes, accelerator.process_index
    set_seed(config.training.seed)
    model = prepare_model(
        load_causal_lm(config.model), config.lora, config.training.gradient_checkpointing
    )
    if world > 1:
        mesh = init_device_mesh("cpu", (world,))
        for layer in [m for m in model.modules() if isinstance(m, LlamaDecoderLayer)]:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = build_optimizer(trainable_parameters(model), config.optimizer)
    scheduler = build_lr_scheduler(optimizer, config.optimizer, config.training.total_steps)
    sampler = RankSlicedSampler(
        MixtureSampler(data.streams, seed=config.training.seed), rank, world
    )
    return HFLearner.around(
        model,
        optimizer,
        scheduler,
        sampler,
        data.dataset_names,
        data.domains,
        accelerator=accelerator,
        max_grad_norm=1.0,
    )


def main(config_path: str, out: str) -> None:
    config = RunConfig.from_dict(yaml.safe_load(Path(config_path).read_text()))
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    data = build_data(
        config.datasets,
        config.training,
        config.evaluation,
        load_tokenizer(config.model),
        accelerator.num_processes,
    )
    learner = sharded_learner(config, accelerator, data)
    weights = np.array([0.5, 0.5])
    evaluations = {"start": learner.evaluate("eval")}
    learner.train(2, weights)
    snapshot = learner.snapshot()
    evaluations["before"] = learner.evaluate("eval")
    learner.probe(3, 0)
    evaluations["probed"] = learner.evaluate("eval")
    learner.restore(snapshot)
    evaluations["restored"] = learner.evaluate("eval")
    learner.train(2, weights)
    evaluations["trained"] = learner.evaluate("eval")
    learner.restore(snapshot)
    learner.train(2, weights)
    evaluations["retrained"] = learner.evaluate("eval")
    # What a run folder stores: the whole training state and model, gathered from the shards
    # (rank 0 writes them), read back by every rank into its shards.
    whole = learner.gathered(learner.snapshot())
    model_state = learner.gathered_model_state()
    if rank == 0:
        save_snapshot(whole, Path(out), "whole")
        if model_state is not None:
            save_file(
                {k: v.contiguous() for k, v in model_state.items()},
                str(Path(out, "model.safetensors")),
            )
            # As dynamics run saves its best checkpoint.
            accelerator.unwrap_model(learner.model).save_pretrained(
                Path(out, "saved"), state_dict=dict(model_state)
            )
    accelerator.wait_for_everyone()
    learner.train(2, weights)
    evaluations["moved_on"] = learner.evaluate("eval")
    learner.load_training_state(load_snapshot(Path(out), "whole"))
    evaluations["reloaded"] = learner.evaluate("eval")
    learner.train(2, weights)
    evaluations["moved_on_again"] = learner.evaluate("eval")
    # A resume reads the state into a fresh optimizer, which holds no Adam moments yet.
    fresh = sharded_learner(config, accelerator, data)
    fresh.load_training_state(load_snapshot(Path(out), "whole"))
    evaluations["fresh_reloaded"] = fresh.evaluate("eval")
    fresh.train(2, weights)
    evaluations["fresh_moved_on"] = fresh.evaluate("eval")
    result = {
        "sharded_parameters": sum(
            type(p).__name__ == "DTensor" for p in learner.trainable_parameters
        ),
        "model_state_keys": None if model_state is None else list(model_state),
        **{name: evaluation.per_batch.tolist() for name, evaluation in evaluations.items()},
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Cost of the engine around the model: training throughput and probe rollback.

(a) ``throughput_ratio``: HFLearner training steps per second over a hand-written
    transformers + PEFT loop (forward, backward, AdamW step, zero grad) on the same model
    and the same batches. Goal: >= 0.95.
(b) ``snapshot_restore_over_step``: one ``snapshot()`` + ``restore()`` over one training
    step, for LoRA (goal <= 0.05) and full fine-tuning (goal <= 0.10). DynaMiCS restores
    once per dataset per update, against c_t (up to 128) probe steps.

    .venv/bin/python benchmarks/engine.py [--hidden 256] [--layers 4] [--seq 128] [--batch 8]

Prints one JSON object. The model is a random-init Llama sized so that a CPU step takes
tens to hundreds of milliseconds. The machine is shared and noisy, so the loops alternate
step by step and every ratio is between medians measured in this run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dynamics.engine.config import LoraConfig, OptimizerConfig
from dynamics.engine.learner import HFLearner
from dynamics.engine.model import build_optimizer, prepare_model, trainable_parameters

GOALS = {"throughput_ratio": 0.95, "snapshot_restore_lora": 0.05, "snapshot_restore_full": 0.10}
VOCAB_SIZE = 260
LORA = LoraConfig(rank=16, alpha=32.0, dropout=0.05)
OPTIMIZER = OptimizerConfig(lr=1e-4)


class CyclingSampler:
    """The sampler contract over one fixed list of batches (one fine-tuning dataset)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches = batches
        self.position = 0

    def next_batch(self, weights: np.ndarray) -> tuple[int, dict[str, torch.Tensor]]:
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        return 0, batch

    def probe_batch(self, dataset: int) -> dict[str, torch.Tensor]:
        return self.next_batch(np.ones(1))[1]

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "probe_streams": []}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = state["position"]


class EvalDomain:
    """One loss domain; the benchmark never evaluates, the learner only needs a domain."""

    name = "eval"
    metric: Literal["loss", "accuracy"] = "loss"

    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.eval_batches = batches
        self.test_batches = batches


def build_model(args: argparse.Namespace, lora: LoraConfig | None) -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        max_position_embeddings=args.seq,
    )
    torch.manual_seed(0)
    return prepare_model(LlamaForCausalLM(config), lora)


def make_batches(args: argparse.Namespace, count: int = 4) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        input_ids = torch.randint(1, VOCAB_SIZE, (args.batch, args.seq), generator=generator)
        batches.append(
            {
                "input_ids": input_ids,
                "attention_mask": torch.ones_like(input_ids),
                "labels": input_ids.clone(),
            }
        )
    return batches


def build_learner(args: argparse.Namespace, lora: LoraConfig | None, batches: list) -> HFLearner:
    return HFLearner(
        build_model(args, lora),
        CyclingSampler(batches),
        ["data"],
        [EvalDomain(batches)],
        OPTIMIZER,
        total_steps=10_000,
    )


def hand_loop(args: argparse.Namespace, batches: list) -> Callable[[int], None]:
    """The plain loop a user would write without us."""
    model = build_model(args, LORA)
    model.train()
    optimizer = build_optimizer(trainable_parameters(model), OPTIMIZER)
    position = 0

    def train(steps: int) -> None:
        nonlocal position
        for _ in range(steps):
            batch = batches[position % len(batches)]
            position += 1
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return train


def seconds(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def snapshot_restore_seconds(learner: HFLearner, repeats: int) -> list[float]:
    def once() -> None:
        learner.restore(learner.snapshot())

    return [seconds(once) for _ in range(repeats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256, help="hidden size (multiple of 64)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--steps", type=int, default=30, help="timed steps of each loop")
    args = parser.parse_args()

    batches = make_batches(args)
    weights = np.ones(1)
    engine = build_learner(args, LORA, batches)
    hand = hand_loop(args, batches)
    full = build_learner(args, None, batches)
    for warm_up in (
        lambda: engine.train(2, weights),
        lambda: hand(2),
        lambda: full.train(2, weights),
    ):
        warm_up()  # first steps allocate Adam state and warm the allocator

    # Single steps interleaved, so slow phases of the shared machine hit every loop alike;
    # medians drop the steps that a neighbour's burst slowed down.
    engine_step, hand_step, full_step, lora_rollback, full_rollback = [], [], [], [], []
    for k in range(args.steps):
        # Alternate which loop goes first, so neither always runs on a just-warmed cache.
        if k % 2:
            engine_step.append(seconds(lambda: engine.train(1, weights)))
            hand_step.append(seconds(lambda: hand(1)))
        else:
            hand_step.append(seconds(lambda: hand(1)))
            engine_step.append(seconds(lambda: engine.train(1, weights)))
        full_step.append(seconds(lambda: full.train(1, weights)))
        lora_rollback.extend(snapshot_restore_seconds(engine, repeats=3))
        full_rollback.extend(snapshot_restore_seconds(full, repeats=3))

    results = {
        "model": {
            "hidden": args.hidden,
            "layers": args.layers,
            "seq": args.seq,
            "batch": args.batch,
            "lora_rank": LORA.rank,
            "trainable_lora": sum(p.numel() for p in engine.trainable_parameters),
            "trainable_full": sum(p.numel() for p in full.trainable_parameters),
            "torch_threads": torch.get_num_threads(),
        },
        "step_ms": {
            "engine_lora": 1e3 * statistics.median(engine_step),
            "hand_loop_lora": 1e3 * statistics.median(hand_step),
            "engine_full": 1e3 * statistics.median(full_step),
        },
        "snapshot_restore_ms": {
            "lora": 1e3 * statistics.median(lora_rollback),
            "full": 1e3 * statistics.median(full_rollback),
        },
        "throughput_ratio": statistics.median(hand_step) / statistics.median(engine_step),
        "snapshot_restore_over_step": {
            "lora": statistics.median(lora_rollback) / statistics.median(engine_step),
            "full": statistics.median(full_rollback) / statistics.median(full_step),
        },
        "goals": GOALS,
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

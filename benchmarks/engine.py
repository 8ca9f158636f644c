"""Cost of the engine around the model: training throughput and probe rollback.

(a) ``throughput_ratio``: HFLearner training steps per second over a hand-written
    transformers + PEFT loop (forward, backward, AdamW step, zero grad) on the same model
    and the same batches. Goal: >= 0.95.
(b) ``snapshot_restore_over_step``: one ``snapshot()`` + ``restore()`` over one training
    step, for LoRA (goal <= 0.05) and full fine-tuning (goal <= 0.10). DynaMiCS restores
    once per dataset per update, against c_t (up to 128) probe steps.

    .venv/bin/python benchmarks/engine.py [--hidden 256] [--layers 4] [--seq 128] [--batch 8]
    .venv/bin/python benchmarks/engine.py --shape qwen2.5-0.5b --mixed-precision bf16
        --lora-rank 32 --seq 512
    .venv/bin/python benchmarks/engine.py --shape qwen2.5-0.5b --mixed-precision bf16
        --lora-rank 32 --seq 512 --quantization 4

``--profile above-goal`` (or ``always``) adds the torch profiler's top entries over one LoRA
snapshot + restore when its ratio is above the goal (or in any case), sorted by device time
on a GPU and by CPU time on a CPU, so that the next change knows which kernels or Python
calls to remove. ``--quantization 4`` (or 8) measures QLoRA: the random-init model is saved
in bfloat16 to a temporary folder and loaded back through ``model.quantization`` (the
library's bitsandbytes path; a CUDA GPU and bitsandbytes needed), with a LoRA adapter on it;
it measures the engine's LoRA step, snapshot + restore and peak memory, without the plain
loop or full fine-tuning (quantized weights are not trained in full).

Prints one JSON object. By default the model is a random-init Llama sized so that a CPU
step takes tens to hundreds of milliseconds; ``--shape`` takes a named shape of
``benchmarks/shapes.py`` instead. It runs on the GPU when there is one (peak memory is then
reported). The machine is shared and noisy, so the loops alternate step by step and every
ratio is between medians measured in this run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from accelerate import Accelerator
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from dynamics.engine.config import LoraConfig, ModelConfig, OptimizerConfig, QuantizationConfig
from dynamics.engine.learner import HFLearner
from dynamics.engine.model import (
    build_optimizer,
    load_causal_lm,
    prepare_model,
    trainable_parameters,
)

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


def model_config(args: argparse.Namespace) -> Any:
    if args.shape is not None:
        from shapes import SHAPES

        spec = dict(SHAPES[args.shape])
        return AutoConfig.for_model(spec.pop("model_type"), **spec)
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        max_position_embeddings=args.seq,
    )


def build_model(args: argparse.Namespace, lora: LoraConfig | None) -> torch.nn.Module:
    torch.manual_seed(0)
    if args.quantization is None:
        return prepare_model(AutoModelForCausalLM.from_config(model_config(args)), lora)
    # bitsandbytes quantizes weights as they are loaded: save the random-init model and load
    # it back the way a run with model.quantization does.
    with tempfile.TemporaryDirectory() as folder:
        AutoModelForCausalLM.from_config(model_config(args), dtype=torch.bfloat16).save_pretrained(
            folder
        )
        config = ModelConfig(
            name_or_path=folder,
            dtype="bfloat16",
            quantization=QuantizationConfig(bits=args.quantization),
        )
        return prepare_model(load_causal_lm(config), lora)


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
        accelerator=Accelerator(mixed_precision=args.mixed_precision),
    )


def hand_loop(args: argparse.Namespace, batches: list, lora: LoraConfig) -> Callable[[int], None]:
    """The plain loop a user would write without us (autocast for mixed precision)."""
    device = Accelerator().device
    model = build_model(args, lora).to(device)
    model.train()
    optimizer = build_optimizer(trainable_parameters(model), OPTIMIZER)
    on_device = [{k: v.to(device) for k, v in batch.items()} for batch in batches]
    dtype = torch.bfloat16 if args.mixed_precision == "bf16" else None
    position = 0

    def train(steps: int) -> None:
        nonlocal position
        for _ in range(steps):
            batch = on_device[position % len(on_device)]
            position += 1
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    return train


def synchronized(learner: HFLearner, steps: int, weights: np.ndarray) -> None:
    learner.train(steps, weights)
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def seconds(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def profile_snapshot_restore(learner: HFLearner, top: int = 15) -> dict[str, Any]:
    """The torch profiler over one snapshot + restore: its ``top`` entries by device time
    (CUDA) or CPU time (no GPU), times in microseconds."""
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if gpu else [])]
    learner.restore(learner.snapshot())  # outside the profile: the first call may allocate
    if gpu:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        learner.restore(learner.snapshot())
        if gpu:
            torch.cuda.synchronize()
    key = "self_device_time_total" if gpu else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    return {
        "sorted_by": key,
        "total_self_device_us": sum(e.self_device_time_total for e in events) if gpu else None,
        "total_self_cpu_us": sum(e.self_cpu_time_total for e in events),
        "top": [
            {
                "name": e.key,
                "count": e.count,
                "self_device_us": e.self_device_time_total if gpu else None,
                "device_us": e.device_time_total if gpu else None,
                "self_cpu_us": e.self_cpu_time_total,
                "cpu_us": e.cpu_time_total,
            }
            for e in events[:top]
        ],
    }


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
    parser.add_argument(
        "--shape",
        default=None,
        help="a named shape of benchmarks/shapes.py instead of --hidden/--layers",
    )
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16"])
    parser.add_argument("--lora-rank", type=int, default=LORA.rank)
    parser.add_argument(
        "--no-full", action="store_true", help="skip full fine-tuning (large shapes)"
    )
    parser.add_argument(
        "--quantization",
        type=int,
        choices=[4, 8],
        default=None,
        help="QLoRA: load the base weights through bitsandbytes (engine LoRA step only)",
    )
    parser.add_argument(
        "--profile",
        choices=["never", "above-goal", "always"],
        default="never",
        help="the torch profiler's top entries over one LoRA snapshot + restore",
    )
    args = parser.parse_args()

    lora = LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank, dropout=LORA.dropout)
    batches = make_batches(args)
    weights = np.ones(1)
    engine = build_learner(args, lora, batches)
    # The plain loop and full fine-tuning are comparisons for unquantized weights only.
    hand = None if args.quantization else hand_loop(args, batches, lora)
    full = None if args.no_full or args.quantization else build_learner(args, None, batches)
    for warm_up in (
        lambda: synchronized(engine, 2, weights),
        lambda: None if hand is None else hand(2),
        lambda: None if full is None else synchronized(full, 2, weights),
    ):
        warm_up()  # first steps allocate Adam state and warm the allocator
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()

    # Single steps interleaved, so slow phases of the shared machine hit every loop alike;
    # medians drop the steps that a neighbour's burst slowed down.
    engine_step, hand_step, full_step, lora_rollback, full_rollback = [], [], [], [], []
    for k in range(args.steps):
        # Alternate which loop goes first, so neither always runs on a just-warmed cache.
        if hand is None:
            engine_step.append(seconds(lambda: synchronized(engine, 1, weights)))
        elif k % 2:
            engine_step.append(seconds(lambda: synchronized(engine, 1, weights)))
            hand_step.append(seconds(lambda: hand(1)))
        else:
            hand_step.append(seconds(lambda: hand(1)))
            engine_step.append(seconds(lambda: synchronized(engine, 1, weights)))
        lora_rollback.extend(snapshot_restore_seconds(engine, repeats=3))
        if full is not None:
            full_step.append(seconds(lambda: synchronized(full, 1, weights)))
            full_rollback.extend(snapshot_restore_seconds(full, repeats=3))

    def median_ratio(top: list[float], bottom: list[float]) -> float | None:
        return statistics.median(top) / statistics.median(bottom) if top and bottom else None

    def median_ms(times: list[float]) -> float | None:
        return 1e3 * statistics.median(times) if times else None

    peak_memory = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    lora_over_step = median_ratio(lora_rollback, engine_step)
    assert lora_over_step is not None
    profiled = args.profile == "always" or (
        args.profile == "above-goal" and lora_over_step > GOALS["snapshot_restore_lora"]
    )

    tokens = args.batch * args.seq
    config = model_config(args)
    results = {
        "model": {
            "shape": args.shape or f"llama hidden {args.hidden}, {args.layers} layers",
            "hidden": config.hidden_size,
            "layers": config.num_hidden_layers,
            "seq": args.seq,
            "batch": args.batch,
            "mixed_precision": args.mixed_precision,
            "quantization": None
            if args.quantization is None
            else f"bitsandbytes {args.quantization}-bit",
            "device": str(engine.accelerator.device),
            "lora_rank": lora.rank,
            "trainable_lora": sum(p.numel() for p in engine.trainable_parameters),
            "trainable_full": None
            if full is None
            else sum(p.numel() for p in full.trainable_parameters),
            "torch_threads": torch.get_num_threads(),
        },
        "step_ms": {
            "engine_lora": median_ms(engine_step),
            "hand_loop_lora": median_ms(hand_step),
            "engine_full": median_ms(full_step),
        },
        "tokens_per_s": {
            "engine_lora": tokens / statistics.median(engine_step),
            "hand_loop_lora": tokens / statistics.median(hand_step) if hand_step else None,
        },
        "snapshot_restore_ms": {"lora": median_ms(lora_rollback), "full": median_ms(full_rollback)},
        "throughput_ratio": median_ratio(hand_step, engine_step),
        "snapshot_restore_over_step": {
            "lora": lora_over_step,
            "full": median_ratio(full_rollback, full_step),
        },
        "peak_memory_gib": peak_memory,
        "goals": GOALS,
        "profile_snapshot_restore_lora": profile_snapshot_restore(engine) if profiled else None,
        "profile_reason": f"--profile {args.profile}, LoRA snapshot + restore over step "
        f"{lora_over_step:.3f} (goal {GOALS['snapshot_restore_lora']})",
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

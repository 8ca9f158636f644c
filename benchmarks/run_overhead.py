"""Wall time of a DynaMiCS run over a fixed-weight run of the same config, next to the
cost model's prediction (appendix H) for it.

    .venv/bin/python benchmarks/run_overhead.py [--steps 128] [--schedule dense-warmup]
    .venv/bin/python benchmarks/run_overhead.py --shape qwen2.5-0.5b --seq 512 --batch 8 --mixed-precision bf16

Both runs use the same random-init model (a tiny Llama, or a named shape of
``benchmarks/shapes.py``), data (the test fixtures), evaluation settings and steps; only the
policy differs. The ratio is of training wall time (the summary's ``train_seconds``: probes
and evaluations included, model and data setup not); the whole runs' wall times are printed
beside it. The prediction is printed twice: with the paper's assumed ratio (one training
step = 3 forward passes) and with the ratio measured here on this model. On a GPU each
run's peak memory is printed too. Prints one JSON object; ratios come from this one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures.tiny_tokenizer import FIXTURES, tiny_tokenizer  # noqa: E402

from dynamics.core.cost import CostModel, relative_cost  # noqa: E402
from dynamics.core.schedules import build_schedule  # noqa: E402
from dynamics.engine.config import RunConfig  # noqa: E402
from dynamics.engine.run import build_run, run  # noqa: E402
from shapes import SHAPES  # noqa: E402


def config(tokenizer: Path, out: Path, args: argparse.Namespace, method: dict) -> RunConfig:
    steps, schedule = args.steps, args.schedule
    return RunConfig.from_dict(
        {
            "model": {"init_config": SHAPES[args.shape], "tokenizer": str(tokenizer)},
            "lora": {"rank": args.lora_rank, "alpha": 2 * args.lora_rank},
            "optimizer": {"lr": 1e-3},
            "training": {
                "total_steps": steps,
                "batch_size": args.batch,
                "sequence_length": args.seq,
                "mixed_precision": args.mixed_precision,
            },
            # The paper's proportions: evaluate every T/32 steps on 4x the probe's batches.
            "evaluation": {"interval": max(1, steps // 32), "batches": 8, "reduced_batches": 2},
            "method": {"schedule": schedule, **method},
            "datasets": [
                {"name": "math", "path": str(FIXTURES / "metamath.jsonl"), "role": "target",
                 "format": "instruction", "columns": {"prompt": "query"}, "eval_size": 3, "test_size": 3},
                {"name": "wiki", "path": str(FIXTURES / "wikipedia.jsonl"), "role": "non-target"},
                {"name": "orca", "path": str(FIXTURES / "openorca.jsonl"), "role": "constraint",
                 "format": "instruction", "columns": {"prompt": "question"}},
            ],
            "output_dir": str(out),
        }
    )


def measured_train_fwd_ratio(cfg: RunConfig, repeats: int = 20) -> float:
    """Median time of one training step over one evaluation forward pass, same model."""
    built = build_run(cfg)
    learner = built.learner
    weights = torch.tensor([0.5, 0.5]).numpy()
    learner.train(2, weights)  # warm up
    steps, forwards = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        learner.train(1, weights)
        steps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        learner.evaluate("eval", 1)
        # one evaluation = one forward per domain
        forwards.append((time.perf_counter() - t0) / len(learner.domain_names))
    steps.sort()
    forwards.sort()
    return steps[len(steps) // 2] / forwards[len(forwards) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--schedule", default="dense-warmup")
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=4, help="sequences per step")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16"])
    args = parser.parse_args()
    torch.manual_seed(0)
    gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tiny_tokenizer().save_pretrained(folder / "tok")
        walls, train, peak = {}, {}, {}
        for name, method in (
            ("fixed", {"name": "fixed", "weights": {"math": 0.5, "wiki": 0.5}}),
            ("dynamics", {"name": "dynamics"}),
        ):
            cfg = config(folder / "tok", folder / name, args, method)
            if gpu:
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            summary = run(cfg, progress=False)
            walls[name] = time.perf_counter() - started
            train[name] = summary["train_seconds"]
            peak[name] = torch.cuda.max_memory_allocated() / 2**30 if gpu else None
        cfg = config(folder / "tok", folder / "ratio", args, {"name": "dynamics"})
        ratio = measured_train_fwd_ratio(cfg)
    schedule = build_schedule(args.schedule, args.steps)
    ev = cfg.evaluation

    def predicted(train_fwd_ratio: float) -> float:
        model = dataclasses.replace(
            CostModel(train_fwd_ratio=train_fwd_ratio),
            eval_interval=ev.interval,
            main_eval_batches=ev.batches,
            reduced_eval_batches=ev.reduced_batches,
        )
        return relative_cost(schedule, 2, 2, model)

    print(
        json.dumps(
            {
                "benchmark": "run_overhead",
                "shape": args.shape,
                "seq": args.seq,
                "batch": args.batch,
                "mixed_precision": args.mixed_precision,
                "device": "cuda" if gpu else "cpu",
                "steps": args.steps,
                "schedule": args.schedule,
                "fixed_train_s": round(train["fixed"], 2),
                "dynamics_train_s": round(train["dynamics"], 2),
                "measured_cost_ratio": round(train["dynamics"] / train["fixed"], 3),
                "fixed_wall_s": round(walls["fixed"], 2),
                "dynamics_wall_s": round(walls["dynamics"], 2),
                "wall_ratio_with_setup": round(walls["dynamics"] / walls["fixed"], 3),
                "predicted_cost_ratio_assumed_3": round(predicted(3.0), 3),
                "measured_train_fwd_ratio": round(ratio, 2),
                "predicted_cost_ratio_measured_ratio": round(predicted(ratio), 3),
                "peak_memory_gib": {"fixed": peak["fixed"], "dynamics": peak["dynamics"]},
                "note": "measured_cost_ratio compares training wall time (probes and evaluations in, setup out)",
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

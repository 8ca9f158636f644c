"""Wall time of a DynaMiCS run over a fixed-weight run of the same config, next to the
cost model's prediction (appendix H) for it.

    .venv/bin/python benchmarks/run_overhead.py [--steps 128] [--schedule dense-warmup]
        [--processes 1,2]
    .venv/bin/python benchmarks/run_overhead.py --shape qwen2.5-0.5b --seq 512 --batch 8
        --mixed-precision bf16

Both runs use the same random-init model (a tiny Llama, or a named shape of
``benchmarks/shapes.py``), data (the test fixtures), evaluation settings and steps; only the
policy differs. The ratio is of training wall time (the summary's ``train_seconds``: probes
and evaluations included, model and data setup not); the whole runs' wall times are printed
beside it. The prediction is printed twice: with the paper's assumed ratio (one training
step = 3 forward passes) and with the ratio measured here on this model. On a GPU each
run's peak memory is printed too. Prints one JSON object; ratios come from this one run.
A short discarded run comes first (the first run in a process pays for starting up), and
``--full`` measures full fine-tuning instead of a LoRA adapter.

``--processes 1,2`` measures both ratios with 1 and with 2 processes (``torchrun``, gloo on
a CPU, ``--threads`` threads each, the same global batch: ``--batch`` is split among the
processes). The cost model counts forward-pass equivalents, all of which divide among the
processes (evaluations by batch, probes by dataset or by batch), so it predicts the same
ratio for any number of processes; what differs is what it leaves out (all-reduces,
snapshot restores, the solver, Python overhead).

``--paper-evaluation`` takes the paper's evaluation settings (every 64 of 2,048 steps on
200 batches, probes evaluated on 50) scaled by ``--steps`` / 2,048 (at least 1 each)
instead of the defaults (every ``--steps`` / 32 steps on 8 batches, probes on 2); the JSON
says what they became.

``--paper-shape`` measures the paper's cost at the paper's shape instead of comparing two
runs. The model has the shape of Qwen2.5-3B (``benchmarks/shapes.py``; random init, the
library's default dtype: bfloat16 on a GPU that computes in it, float32 elsewhere, with
bf16 autocast on a GPU), LoRA rank 32 on every projection, sequences of 512 tokens of
random ids, batches of 8 (``--seq`` and ``--batch`` change them, for a toy run on a CPU; the
JSON says whether they are the paper's), ``--datasets`` fine-tuning datasets and ``--domains``
evaluation domains. ``--scale s`` shrinks it for a smaller GPU or a CPU: layers, attention heads
(128 wide each; the KV heads keep the 8:1 grouping), hidden and MLP width and the vocabulary
are multiplied by ``s`` (at least 1 layer, 1 head and 512 tokens). It follows a 2,048-step
DynaMiCS run with the dense-warmup schedule through the learner, in order: a main
evaluation of 200 batches per domain every 64 steps, and at every update an anchor
evaluation (unless recycled from a main one) and, per dataset, a probe of c_t steps, a
reduced evaluation of 50 batches and a restore, with training steps in between at uniform
weights (the solver, which runs on the CPU and which the cost model leaves out, is not
run). It stops when ``--seconds`` have passed (checked before each evaluation, probe and
stretch of at most 16 training steps) and reports what it measured: the mean time per
training step, per main evaluation, per probe step and per reduced evaluation, with how
many of each ran. From those it gives the cost model's prediction for the whole run
(``dynamics.core.cost``): with one training step over one evaluation forward as the
measured ratio, for this N and M and averaged over the paper's 50 scenarios, beside the
paper's 1.7 for dense warm-up; and with all four measured unit costs in the model's
formula. A unit that did not run is null, with the reason, and so is every prediction that
needs it. One discarded training step, probe step, restore and one-batch evaluation come
first (outside ``--seconds``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures.tiny_tokenizer import FIXTURES, tiny_tokenizer  # noqa: E402

from dynamics.core.cost import (  # noqa: E402
    PAPER_COST_ROWS,
    CostModel,
    mean_relative_cost,
    relative_cost,
    run_cost,
)
from dynamics.core.schedules import PAPER_TOTAL_STEPS, build_schedule  # noqa: E402
from dynamics.engine.components import build_run  # noqa: E402
from dynamics.engine.config import RunConfig  # noqa: E402
from dynamics.engine.run import run  # noqa: E402
from shapes import SHAPES  # noqa: E402


def config(
    tokenizer: Path, out: Path, args: argparse.Namespace, method: dict, processes: int = 1
) -> RunConfig:
    steps, schedule = args.steps, args.schedule
    return RunConfig.from_dict(
        {
            "model": {"init_config": SHAPES[args.shape], "tokenizer": str(tokenizer)},
            "lora": None if args.full else {"rank": args.lora_rank, "alpha": 2 * args.lora_rank},
            "optimizer": {"lr": 1e-3},
            "training": {
                "total_steps": steps,
                "batch_size": args.batch // processes,
                "sequence_length": args.seq,
                "mixed_precision": args.mixed_precision,
                "split_probes": not args.together,
            },
            "evaluation": {**evaluation_settings(args), "batch_size": args.batch},
            "method": {"schedule": schedule, **method},
            "datasets": [
                {
                    "name": "math",
                    "path": str(FIXTURES / "metamath.jsonl"),
                    "role": "target",
                    "format": "instruction",
                    "columns": {"prompt": "query"},
                    "eval_size": 3,
                    "test_size": 3,
                },
                {"name": "wiki", "path": str(FIXTURES / "wikipedia.jsonl"), "role": "non-target"},
                {
                    "name": "orca",
                    "path": str(FIXTURES / "openorca.jsonl"),
                    "role": "constraint",
                    "format": "instruction",
                    "columns": {"prompt": "question"},
                },
            ],
            "output_dir": str(out),
        }
    )


def evaluation_settings(args: argparse.Namespace) -> dict[str, int]:
    """The main evaluation's interval and batches and the probes' reduced batches."""
    if args.paper_evaluation:
        # The paper's settings at 2,048 steps, scaled by steps / 2,048.
        factor = args.steps / PAPER_TOTAL_STEPS
        paper = CostModel()
        return {
            "interval": max(1, round(paper.eval_interval * factor)),
            "batches": max(1, round(paper.main_eval_batches * factor)),
            "reduced_batches": max(1, round(paper.reduced_eval_batches * factor)),
        }
    # The paper's proportions: evaluate every T/32 steps on 4x the probe's batches.
    return {"interval": max(1, args.steps // 32), "batches": 8, "reduced_batches": 2}


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


METHODS = (
    ("fixed", {"name": "fixed", "weights": {"math": 0.5, "wiki": 0.5}}),
    ("dynamics", {"name": "dynamics"}),
)


def run_in_process(cfg: RunConfig) -> tuple[dict, float, float | None]:
    """(the run's summary, whole-run seconds, peak GPU memory in GiB or None) of one run."""
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    summary = run(cfg, progress=False)
    wall = time.perf_counter() - started
    return summary, wall, torch.cuda.max_memory_allocated() / 2**30 if gpu else None


def run_with_torchrun(cfg: RunConfig, processes: int, threads: int) -> tuple[dict, float, None]:
    """The same under ``torchrun`` with ``processes`` processes of ``threads`` threads."""
    path = Path(cfg.output_dir).with_suffix(".yaml")
    path.write_text(cfg.to_yaml())
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        "-m",
        "dynamics.cli",
        "run",
        str(path),
        "--no-progress",
    ]
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - started
    return json.loads((Path(cfg.output_dir) / "summary.json").read_text()), wall, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--schedule", default="dense-warmup")
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    parser.add_argument(
        "--seq", type=int, default=None, help="tokens per sequence (128; --paper-shape: 512)"
    )
    parser.add_argument(
        "--batch", type=int, default=None, help="sequences per step, global (4; --paper-shape: 8)"
    )
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument(
        "--full", action="store_true", help="full fine-tuning (lora: null) instead of LoRA"
    )
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16"])
    parser.add_argument("--processes", default="1", help="comma-separated process counts, e.g. 1,2")
    parser.add_argument(
        "--threads", type=int, default=None, help="threads per process (default: torch's)"
    )
    parser.add_argument(
        "--together",
        action="store_true",
        help="every process takes part in every probe (training.split_probes: false)",
    )
    parser.add_argument(
        "--paper-evaluation",
        action="store_true",
        help="the paper's evaluation settings (every 64 of 2,048 steps on 200 batches, "
        "probes on 50) scaled by --steps/2048",
    )
    paper = parser.add_argument_group(
        "--paper-shape: the paper's cost at the paper's shape (module docstring)"
    )
    paper.add_argument("--paper-shape", action="store_true")
    paper.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="layers, heads, width and vocabulary times this (0 < s <= 1)",
    )
    paper.add_argument(
        "--seconds", type=float, default=600.0, help="time budget of the measured part"
    )
    paper.add_argument("--datasets", type=int, default=2, help="N, fine-tuning datasets")
    paper.add_argument(
        "--domains", type=int, default=2, help="M, evaluation domains (targets + constraints)"
    )
    args = parser.parse_args()
    args.seq = args.seq or (PAPER_SEQ if args.paper_shape else 128)
    args.batch = args.batch or (PAPER_BATCH if args.paper_shape else 4)
    if args.paper_shape:
        if not 0 < args.scale <= 1:
            parser.error(f"--scale must be in (0, 1], got {args.scale}")
        if args.datasets < 1 or args.domains < 1 or args.seconds < 0:
            parser.error("--datasets and --domains must be at least 1 and --seconds at least 0")
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        print(json.dumps(paper_shape(args), indent=2))
        return
    counts = [int(p) for p in args.processes.split(",")]
    if any(p < 1 or args.batch % p for p in counts):
        parser.error(f"--batch {args.batch} must divide among --processes {args.processes}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    gpu = torch.cuda.is_available()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tiny_tokenizer().save_pretrained(folder / "tok")
        if 1 in counts:
            # The first run in a process pays for starting up (on a GPU: kernel selection, the
            # allocator growing its pool); a short discarded run keeps that out of the fixed
            # run's time, which came first and measured slower than DynaMiCS on an H100.
            warmup = argparse.Namespace(**{**vars(args), "steps": max(2, args.steps // 16)})
            run_in_process(config(folder / "tok", folder / "warmup", warmup, METHODS[0][1]))
        for processes in counts:
            summaries, walls, peak = {}, {}, {}
            for name, method in METHODS:
                cfg = config(
                    folder / "tok", folder / f"{name}-{processes}", args, method, processes
                )
                if processes == 1:
                    summaries[name], walls[name], peak[name] = run_in_process(cfg)
                else:
                    summaries[name], walls[name], peak[name] = run_with_torchrun(
                        cfg, processes, args.threads or 1
                    )
            train = {name: summary["train_seconds"] for name, summary in summaries.items()}
            results[str(processes)] = {
                "fixed_train_s": round(train["fixed"], 2),
                "dynamics_train_s": round(train["dynamics"], 2),
                "measured_cost_ratio": round(train["dynamics"] / train["fixed"], 3),
                "fixed_wall_s": round(walls["fixed"], 2),
                "dynamics_wall_s": round(walls["dynamics"], 2),
                "wall_ratio_with_setup": round(walls["dynamics"] / walls["fixed"], 3),
                # Probing and solving, the part DynaMiCS adds (its reduced evaluations included).
                "dynamics_update_s": round(summaries["dynamics"]["probe_seconds"], 2),
                "peak_memory_gib": {"fixed": peak["fixed"], "dynamics": peak["dynamics"]},
            }
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
                "fine_tuning": "full" if args.full else f"lora rank {args.lora_rank}",
                "device": "cuda" if gpu else "cpu",
                "threads_per_process": args.threads or torch.get_num_threads(),
                "split_probes": not args.together,
                "steps": args.steps,
                "schedule": args.schedule,
                "evaluation": {**evaluation_settings(args), "batch_size": args.batch},
                "evaluation_settings": (
                    f"the paper's (every {CostModel().eval_interval} of {PAPER_TOTAL_STEPS} steps "
                    f"on {CostModel().main_eval_batches} batches, "
                    f"probes on {CostModel().reduced_eval_batches}) "
                    f"scaled by {args.steps}/{PAPER_TOTAL_STEPS}, each at least 1"
                    if args.paper_evaluation
                    else f"every {args.steps}/32 steps on 8 batches, probes on 2 "
                    "(the paper's 4:1 batches)"
                ),
                "processes": results,
                "predicted_cost_ratio_assumed_3": round(predicted(3.0), 3),
                "measured_train_fwd_ratio": round(ratio, 2),
                "predicted_cost_ratio_measured_ratio": round(predicted(ratio), 3),
                "note": "measured_cost_ratio compares training wall time (probes and evaluations "
                "in, setup out); the prediction is the same for any number of processes",
            },
            indent=2,
        )
    )


# --- --paper-shape ------------------------------------------------------------------------

PAPER_SEQ, PAPER_BATCH, PAPER_LORA_RANK = 512, 8, 32
PAPER_SCHEDULE = "dense-warmup"
DISTINCT_BATCHES = 4  # random-id batches per dataset and domain, cycled
UNITS = ("train_step", "main_evaluation", "probe_step", "reduced_evaluation")
PRE_TIMED_STEPS = 4  # training steps timed before the schedule (see paper_shape)


def scaled_shape(scale: float) -> dict[str, Any]:
    """Qwen2.5-3B's shape with layers, heads (each 128 wide), widths and vocabulary times
    ``scale``; the KV heads keep the 8:1 grouping where the head count allows."""
    base = dict(SHAPES["qwen2.5-3b"])
    if scale == 1:
        return base
    head_dim = base["hidden_size"] // base["num_attention_heads"]
    heads = max(1, round(base["num_attention_heads"] * scale))
    group = base["num_attention_heads"] // base["num_key_value_heads"]
    kv_heads = max(d for d in range(1, heads + 1) if heads % d == 0 and d <= max(1, heads // group))
    hidden = heads * head_dim
    return {
        **base,
        "hidden_size": hidden,
        "intermediate_size": round(base["intermediate_size"] * hidden / base["hidden_size"]),
        "num_hidden_layers": max(1, round(base["num_hidden_layers"] * scale)),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": max(512, round(base["vocab_size"] * scale)),
    }


class PaperSampler:
    """The sampler contract over ``N`` datasets of cycled random-id batches."""

    def __init__(self, batches: list[list[dict[str, torch.Tensor]]]) -> None:
        self.batches = batches
        self.position = 0
        self.probe_positions = [0] * len(batches)
        self.rng = np.random.default_rng(0)

    def next_batch(self, weights: np.ndarray) -> tuple[int, dict[str, torch.Tensor]]:
        dataset = int(self.rng.choice(len(self.batches), p=weights / weights.sum()))
        self.position += 1
        return dataset, self.batches[dataset][self.position % DISTINCT_BATCHES]

    def probe_batch(self, dataset: int) -> dict[str, torch.Tensor]:
        self.probe_positions[dataset] += 1
        return self.batches[dataset][self.probe_positions[dataset] % DISTINCT_BATCHES]

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "probe_streams": list(self.probe_positions)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = state["position"]
        self.probe_positions = list(state["probe_streams"])


@dataclasses.dataclass
class PaperDomain:
    """One loss domain: the main evaluation's batches (its first 50 are the reduced ones)."""

    name: str
    eval_batches: list[dict[str, torch.Tensor]]
    test_batches: list[dict[str, torch.Tensor]]
    metric: str = "loss"


def random_batches(
    vocab: int, count: int, batch: int, seq: int, generator: torch.Generator
) -> list[dict[str, torch.Tensor]]:
    batches = []
    for _ in range(count):
        ids = torch.randint(0, vocab, (batch, seq), generator=generator)
        batches.append(
            {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
        )
    return batches


def paper_learner(shape: dict[str, Any], args: argparse.Namespace) -> Any:
    from accelerate import Accelerator
    from transformers import AutoConfig, AutoModelForCausalLM

    from dynamics.engine.config import LoraConfig, OptimizerConfig
    from dynamics.engine.learner import HFLearner
    from dynamics.engine.model import prepare_model, resolve_dtype

    gpu = torch.cuda.is_available()
    spec = dict(shape)
    torch.manual_seed(0)
    # Initialised where it will run: random init of billions of weights on a CPU is slow.
    with torch.device("cuda" if gpu else "cpu"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(spec.pop("model_type"), **spec), dtype=resolve_dtype("auto")
        )
    model = prepare_model(model, LoraConfig(rank=PAPER_LORA_RANK, alpha=2.0 * PAPER_LORA_RANK))
    generator = torch.Generator().manual_seed(0)
    main_batches = CostModel().main_eval_batches
    vocab, n_datasets = shape["vocab_size"], args.datasets
    datasets = [
        random_batches(vocab, DISTINCT_BATCHES, args.batch, args.seq, generator)
        for _ in range(n_datasets)
    ]
    domains = []
    for m in range(args.domains):
        distinct = random_batches(vocab, DISTINCT_BATCHES, args.batch, args.seq, generator)
        cycled = [distinct[b % DISTINCT_BATCHES] for b in range(main_batches)]
        domains.append(PaperDomain(f"domain{m}", cycled, cycled))
    return HFLearner(
        model,
        PaperSampler(datasets),
        [f"dataset{j}" for j in range(n_datasets)],
        domains,
        OptimizerConfig(lr=1e-4),
        total_steps=PAPER_TOTAL_STEPS,
        accelerator=Accelerator(mixed_precision="bf16" if gpu else "no"),
    )


def predictions(units: dict[str, float | None], n_datasets: int, n_domains: int) -> dict[str, Any]:
    """The cost model's 2,048-step dense-warmup predictions from measured unit seconds
    (module docstring); each is null, with the reason, when a unit it needs is missing."""
    from dynamics.data.scenarios import list_scenarios

    schedule = build_schedule(PAPER_SCHEDULE, PAPER_TOTAL_STEPS)
    paper = CostModel()
    step, main, probe, reduced = (units[u] for u in UNITS)
    out: dict[str, Any] = {
        "paper_relative_cost": next(
            r.paper_value
            for r in PAPER_COST_ROWS
            if r.schedule == PAPER_SCHEDULE and r.predictor == "linear"
        ),
        "assumed_train_fwd_ratio_3": {
            "relative_cost": relative_cost(schedule, n_datasets, n_domains, paper),
            "mean_over_paper_scenarios": mean_relative_cost(
                schedule, paper_sizes(list_scenarios()), paper
            ),
        },
    }
    if step is None or main is None:
        out["measured_train_fwd_ratio"] = None
        out["reason_train_fwd_ratio"] = "needs a measured training step and main evaluation"
    else:
        # One evaluation forward: a main evaluation is M domains x 200 batches.
        ratio = step / (main / (n_domains * paper.main_eval_batches))
        measured = dataclasses.replace(paper, train_fwd_ratio=ratio)
        out["measured_train_fwd_ratio"] = ratio
        out["measured_train_fwd_ratio_model"] = {
            "relative_cost": relative_cost(schedule, n_datasets, n_domains, measured),
            "mean_over_paper_scenarios": mean_relative_cost(
                schedule, paper_sizes(list_scenarios()), measured
            ),
        }
    missing = [u for u in UNITS if units[u] is None]
    if missing:
        out["all_measured_units"] = None
        out["reason_all_measured_units"] = f"needs every unit; not measured: {', '.join(missing)}"
    else:
        assert step is not None and main is not None and probe is not None and reduced is not None
        cost = run_cost(schedule, n_datasets, n_domains, paper)
        fixed = float(np.sum(cost.horizons * step + cost.horizons / paper.eval_interval * main))
        added = float(
            np.sum(
                n_datasets * (cost.probe_budgets * probe + paper.n_evals * reduced)
                + np.where(cost.recycled, 0.0, reduced)
            )
        )
        out["all_measured_units"] = {
            "relative_cost": (fixed + added) / fixed,
            "fixed_run_s": fixed,
            "dynamics_run_s": fixed + added,
        }
    return out


def paper_sizes(scenarios: Any) -> list[tuple[int, int]]:
    """(N, M) of the paper's 50 scenarios (table tab:scenarios), as
    ``dynamics cost --paper-tables``."""
    return [(s.N, s.M) for s in scenarios if s.table == "tab:scenarios"]


def paper_shape(args: argparse.Namespace) -> dict[str, Any]:
    gpu = torch.cuda.is_available()
    n, m = args.datasets, args.domains
    shape = scaled_shape(args.scale)
    learner = paper_learner(shape, args)
    paper = CostModel()
    schedule = build_schedule(PAPER_SCHEDULE, PAPER_TOTAL_STEPS)
    uniform = np.full(n, 1.0 / n)

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    # Discarded: the first calls pay for allocating Adam state, kernel selection, caches.
    learner.train(1, uniform)
    warm = learner.snapshot()
    learner.probe(1, 0)
    learner.restore(warm)
    learner.evaluate("eval", 1)
    sync()
    if gpu:
        torch.cuda.reset_peak_memory_stats()

    seconds = {u: 0.0 for u in (*UNITS, "restore")}
    counts = {u: 0 for u in (*UNITS, "restore")}
    start = time.perf_counter()
    stopped: str | None = None

    def timed(unit: str, work: Callable[[], object], units: int = 1) -> None:
        sync()
        t0 = time.perf_counter()
        work()
        sync()
        seconds[unit] += time.perf_counter() - t0
        counts[unit] += units

    def out_of_time(before: str) -> bool:
        nonlocal stopped
        if time.perf_counter() - start >= args.seconds:
            stopped = f"--seconds {args.seconds:g} ran out before {before}"
        return stopped is not None

    # Training steps timed first, outside the schedule: at the paper's shape the step-0
    # evaluation and probes alone can outlast --seconds, and every prediction needs a step's
    # cost. Only the per-unit means are used, so these steps count like the schedule's
    # (in counts["train_step"], not in steps_trained).
    if not out_of_time("the training steps timed first"):
        timed("train_step", lambda: learner.train(PRE_TIMED_STEPS, uniform), units=PRE_TIMED_STEPS)
    step, updates = 0, 0
    while step < PAPER_TOTAL_STEPS and stopped is None:
        if step % paper.eval_interval == 0:
            if out_of_time(f"the main evaluation at step {step}"):
                break
            timed("main_evaluation", lambda: learner.evaluate("eval", paper.main_eval_batches))
        if step in schedule:
            budget = schedule.probe_budget(step)
            if step % paper.eval_interval and not out_of_time(
                f"the anchor evaluation at step {step}"
            ):
                timed(
                    "reduced_evaluation",
                    lambda: learner.evaluate("eval", paper.reduced_eval_batches),
                )
            snapshot = learner.snapshot()
            for j in range(n):
                if out_of_time(f"probe {j} of the update at step {step}"):
                    break
                timed("probe_step", lambda c=budget, d=j: learner.probe(c, d), units=budget)
                timed(
                    "reduced_evaluation",
                    lambda: learner.evaluate("eval", paper.reduced_eval_batches),
                )
                timed("restore", lambda s=snapshot: learner.restore(s))
            if stopped is not None:
                break
            updates += 1
        following = [s for s in schedule.steps if s > step]
        until = min(
            [
                *following[:1],
                (step // paper.eval_interval + 1) * paper.eval_interval,
                PAPER_TOTAL_STEPS,
            ]
        )
        while step < until:
            if out_of_time(f"training step {step}"):
                break
            chunk = min(16, until - step)
            timed("train_step", lambda k=chunk: learner.train(k, uniform), units=chunk)
            step += chunk
    elapsed = time.perf_counter() - start

    per_unit = {u: seconds[u] / counts[u] if counts[u] else None for u in (*UNITS, "restore")}
    reasons = {
        u: f"did not run: {stopped}" if stopped else "did not run"
        for u in (*UNITS, "restore")
        if per_unit[u] is None
    }
    trainable = sum(p.numel() for p in learner.trainable_parameters)
    return {
        "benchmark": "run_overhead --paper-shape",
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "torch_threads": torch.get_num_threads(),
        "model": {
            "shape": "qwen2.5-3b" if args.scale == 1 else f"qwen2.5-3b scaled by {args.scale:g}",
            "scale": args.scale,
            **{k: v for k, v in shape.items() if k != "model_type"},
            "dtype": str(next(learner.model.parameters()).dtype).removeprefix("torch."),
            "mixed_precision": "bf16" if gpu else "no",
            "lora_rank": PAPER_LORA_RANK,
            "trainable_parameters": trainable,
        },
        "seq": args.seq,
        "batch": args.batch,
        "paper_seq_and_batch": (args.seq, args.batch) == (PAPER_SEQ, PAPER_BATCH),
        "N_datasets": n,
        "M_domains": m,
        "schedule": PAPER_SCHEDULE,
        "total_steps": PAPER_TOTAL_STEPS,
        "evaluation": {
            "interval": paper.eval_interval,
            "main_batches": paper.main_eval_batches,
            "reduced_batches": paper.reduced_eval_batches,
            "batch_size": args.batch,
            "split": "eval only (a run's main evaluation also evaluates the test split, "
            "which the cost model leaves out)",
        },
        "seconds_budget": args.seconds,
        "measured": {
            "elapsed_s": elapsed,
            "stopped": stopped or f"all {PAPER_TOTAL_STEPS} steps ran",
            "steps_trained": step,
            "updates_completed": updates,
            "counts": counts,
            "total_s": seconds,
            "unit_s": per_unit,
            "reasons": reasons,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else None,
        },
        "predicted_2048_steps": predictions({u: per_unit[u] for u in UNITS}, n, m),
        "note": "unit_s are means over what ran (per training step, "
        "per main evaluation of M x 200 batches, per probe step, "
        "per reduced evaluation of M x 50 batches); "
        "predicted_2048_steps are the cost model (dynamics.core.cost) evaluated on them, "
        "not measurements of a whole run",
    }


if __name__ == "__main__":
    main()

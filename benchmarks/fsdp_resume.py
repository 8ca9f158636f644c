"""``dynamics run`` under FSDP2, stopped and resumed: the run folder's checkpoints end to end.

    python benchmarks/fsdp_resume.py [--processes P] [--no-fsdp]

Launches a short LoRA run of a tiny random-init Llama on the test fixtures with ``torchrun``
and accelerate's FSDP2 (``ACCELERATE_USE_FSDP=true FSDP_VERSION=2``, what
``accelerate launch --use_fsdp --fsdp_version 2`` sets), with a resume point every 4 steps.
Then it copies the finished run folder, removes its summary (as if the run had stopped after
its last resume point) and resumes the copy with ``dynamics run --resume``. It prints one
JSON object: whether the resumed run's evaluations equal the uninterrupted run's, and the
shapes of the saved adapter's tensors (whole tensors, not one rank's shards). It is a
real test of the gathering only with two processes or more (``--processes``, by default one
per GPU): with one, each shard is already the whole tensor.

accelerate shards only on GPUs: on a CPU, ``--no-fsdp`` runs the same check unsharded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engine.test_run import tiny_config  # noqa: E402
from tests.fixtures.tiny_tokenizer import tiny_tokenizer  # noqa: E402

from dynamics.runs.rundir import CHECKPOINT_DIR  # noqa: E402
from dynamics.runs.state import MANIFEST_FILE, RESUME_DIR  # noqa: E402


def run_config(tokenizer: Path, out: Path) -> dict:
    """The test suite's tiny run (a random-init Llama, the fixtures), with a LoRA adapter on
    every projection and a resume point every 4 of its 12 steps."""
    data = tiny_config(tokenizer, out, schedule=[0, 4, 8])
    data["lora"] = {"rank": 8, "alpha": 16}
    data["training"].update(total_steps=12, checkpoint_interval=4)
    return data


def launch(args: list[str], processes: int, fsdp: bool) -> None:
    """``dynamics run ARGS`` under ``torchrun`` with ``processes`` processes; one process
    without FSDP needs no launcher and runs in this one."""
    if processes == 1 and not fsdp:
        from dynamics.cli import main as cli_main

        with contextlib.redirect_stdout(sys.stderr):  # stdout carries this script's JSON alone
            code = cli_main(["run", *args, "--no-progress"])
        if code != 0:
            sys.exit(f"dynamics run {' '.join(args)} failed")
        return
    paths = [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(paths)}
    if fsdp:
        env.update(ACCELERATE_USE_FSDP="true", FSDP_VERSION="2")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        "-m",
        "dynamics.cli",
        "run",
        *args,
        "--no-progress",
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-4000:]}")


def evaluations(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [
        {"step": row["step"], "eval": row["eval"], "test": row["test"], "weights": row["weights"]}
        for row in rows
    ]


def max_relative_difference(a: list[dict], b: list[dict]) -> float:
    worst = 0.0
    for row_a, row_b in zip(a, b, strict=True):
        for split in ("eval", "test", "weights"):
            for name, value in row_a[split].items():
                worst = max(worst, abs(value - row_b[split][name]) / max(abs(value), 1e-12))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--processes",
        type=int,
        default=max(1, torch.cuda.device_count()),
        help="processes, one per GPU (default: every GPU); "
        "with one, each shard is the whole tensor",
    )
    parser.add_argument(
        "--no-fsdp", action="store_true", help="plain data parallelism (what a CPU can run)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tiny_tokenizer().save_pretrained(folder / "tok")
        config = folder / "run.yaml"
        config.write_text(yaml.safe_dump(run_config(folder / "tok", folder / "whole")))
        launch([str(config)], args.processes, fsdp=not args.no_fsdp)
        whole = folder / "whole"
        resumed = folder / "resumed"
        shutil.copytree(whole, resumed)
        (resumed / "summary.json").unlink()
        resumed_from = json.loads((resumed / RESUME_DIR / MANIFEST_FILE).read_text())["step"]
        launch(["--resume", str(resumed)], args.processes, fsdp=not args.no_fsdp)
        with safe_open(str(whole / CHECKPOINT_DIR / "adapter_model.safetensors"), "pt") as adapter:
            shapes = {name: list(adapter.get_slice(name).get_shape()) for name in adapter.keys()}
        summary = json.loads((resumed / "summary.json").read_text())
        difference = max_relative_difference(evaluations(whole), evaluations(resumed))
        print(
            json.dumps(
                {
                    "benchmark": "fsdp_resume",
                    "fsdp": not args.no_fsdp,
                    "processes": args.processes,
                    "resumed_from_step": resumed_from,
                    "resumed_at": summary["resumed_at"],
                    "evaluations": len(evaluations(resumed)),
                    "max_relative_difference_resumed_vs_uninterrupted": difference,
                    "adapter_tensors": len(shapes),
                    "adapter_shapes": sorted({"x".join(map(str, s)) for s in shapes.values()}),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()

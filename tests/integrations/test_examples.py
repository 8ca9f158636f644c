"""The Trainer examples run as a user runs it: a subprocess from the repository root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # each example trains in a subprocess


@pytest.mark.parametrize("script", ["trainer.py", "trl_sft.py"])
def test_each_trainer_example_writes_a_run_folder(tmp_path, script):
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, f"examples/{script}", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"run folder: {out}" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer"] is True and summary["total_steps"] == 32
    assert (out / "controller.jsonl").read_text().count("\n") == 6  # dense warmup over 32 steps: 0, 1, 2, 4, 8, 16

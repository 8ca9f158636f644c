"""The GPU check script runs end to end at a toy size on the CPU, so it is ready (and not
rotten) when a GPU machine is available."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_the_gpu_check_prints_one_json_object_with_its_measurements():
    env = {**os.environ, "DYNAMICS_GPU_CHECK_TOY": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
    done = subprocess.run(
        ["bash", "benchmarks/gpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    engine, overhead = result["engine"], result["run_overhead"]
    assert engine["model"]["shape"] == "tiny" and overhead["shape"] == "tiny"
    one = overhead["processes"]["1"]
    values = [
        engine["throughput_ratio"],
        engine["tokens_per_s"]["engine_lora"],
        engine["snapshot_restore_over_step"]["lora"],
        one["measured_cost_ratio"],
        overhead["predicted_cost_ratio_measured_ratio"],
    ]
    assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in values), values
    assert one["dynamics_train_s"] <= one["dynamics_wall_s"]  # setup left out

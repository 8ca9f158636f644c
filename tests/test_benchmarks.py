"""The GPU checks run end to end on the CPU (the GPU check at a toy size, the FSDP resume
check unsharded), so they are ready (and not rotten) when a GPU machine is available."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
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


def test_the_fsdp_resume_check_resumes_a_run_to_the_same_evaluations():
    """benchmarks/fsdp_resume.py, unsharded (accelerate shards only on GPUs): a finished run's
    copy, its summary removed, resumes from its last resume point to the same evaluations."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "benchmarks/fsdp_resume.py", "--no-fsdp"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["fsdp"] is False
    assert result["resumed_from_step"] == 8 and result["resumed_at"] == [8]
    assert result["evaluations"] == 4  # steps 0, 4, 8, 12
    assert result["max_relative_difference_resumed_vs_uninterrupted"] == 0.0
    # LoRA rank 8 on every projection of a model of hidden size 32 (keys and values 16, the
    # MLP 64): whole A and B matrices.
    assert result["adapter_shapes"] == ["16x8", "32x8", "64x8", "8x32", "8x64"]

"""The GPU checks run end to end on the CPU (the GPU check at a toy size, the FSDP resume
check unsharded, the paper-shape cost measurement at a toy scale), so they are ready (and
not rotten) when a GPU machine is available."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynamics.core.cost import CostModel, relative_cost, run_cost
from dynamics.core.schedules import build_schedule
from tests.fixtures.preloaded import Child

ROOT = Path(__file__).resolve().parents[1]
UNITS = ("train_step", "main_evaluation", "probe_step", "reduced_evaluation")

pytestmark = pytest.mark.slow


def run_json(command: list[str], **env: str) -> dict:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **env}
    done = subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def gpu_check() -> dict:
    """benchmarks/gpu.sh at its toy size: the JSON it prints."""
    return run_json(["bash", "benchmarks/gpu.sh"], DYNAMICS_GPU_CHECK_TOY="1")


def test_the_gpu_check_prints_one_json_object_with_its_measurements(gpu_check):
    result = gpu_check
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
    # The paper's evaluation every 64 of 2,048 steps on 200 batches, probes on 50,
    # scaled to 16 steps.
    assert overhead["evaluation"] == {
        "interval": 1,
        "batches": 2,
        "reduced_batches": 1,
        "batch_size": 2,
    }
    # The toy run profiles in any case (on a GPU only above the goal): the top entries by time.
    profile = engine["profile_snapshot_restore_lora"]
    assert profile["top"] and all(
        entry["self_cpu_us"] >= 0 and entry["name"] for entry in profile["top"]
    )
    assert result["paper_shape"]["benchmark"] == "run_overhead --paper-shape"
    # No GPU here: what needs one says so instead of failing or reporting nothing.
    assert result["gpus"] == 0
    assert "two GPUs or more" in result["fsdp_resume"]["skipped"]
    assert "CUDA GPU" in result["qlora"]["skipped"]
    # Multiple-choice scoring: the same scores from the scored positions' logits as from
    # every position's, and one position per prompt for letters (rows of 16 tokens).
    scoring = result["scoring"]
    assert scoring["letter"]["logits_bytes_ratio"] == 1 / 16
    assert 0 < scoring["continuation"]["logits_bytes_ratio"] <= 8 / 16
    assert all(scoring[way]["max_abs_difference"] < 1e-5 for way in ("letter", "continuation"))
    for name in ("engine", "run_overhead", "paper_shape", "scoring"):
        assert "failed" not in result[name] and result[name]["section_seconds"] >= 0
    assert result["total_seconds"] >= 0


def test_the_gpu_check_runs_only_the_sections_it_is_asked_for():
    """DYNAMICS_GPU_CHECK_SECTIONS picks sections (a short GPU lease spends its time on what
    has not run yet); the others say why they did not run, and a misspelt name is refused."""
    # The two sections this CPU skips for want of GPUs: nothing trains, and each says why.
    result = run_json(
        ["bash", "benchmarks/gpu.sh"],
        DYNAMICS_GPU_CHECK_TOY="1",
        DYNAMICS_GPU_CHECK_SECTIONS="fsdp_resume,qlora",
    )
    for name in ("engine", "run_overhead", "paper_shape", "scoring"):
        assert result[name] == {"skipped": "not in DYNAMICS_GPU_CHECK_SECTIONS (fsdp_resume,qlora)"}
    assert "two GPUs or more" in result["fsdp_resume"]["skipped"]
    assert "CUDA GPU" in result["qlora"]["skipped"]
    environment = {
        **os.environ,
        "DYNAMICS_GPU_CHECK_TOY": "1",
        "DYNAMICS_GPU_CHECK_SECTIONS": "engine,qlroa",
    }
    done = subprocess.run(
        ["bash", "benchmarks/gpu.sh"], cwd=ROOT, env=environment, capture_output=True, text=True
    )
    assert done.returncode == 2 and "unknown section 'qlroa'" in done.stderr and not done.stdout


@pytest.fixture
def run_overhead(monkeypatch):
    """benchmarks/run_overhead.py as a module of this process."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import run_overhead

    return run_overhead


PAPER_TOY = [
    "benchmarks/run_overhead.py",
    "--paper-shape",
    "--scale",
    "0.005",
    "--seq",
    "32",
    "--batch",
    "1",
]


def test_the_paper_shape_cost_is_the_cost_models_on_the_measured_unit_costs(gpu_check):
    """At a toy scale (the GPU check's paper-shape section) the first seconds of the
    dense-warmup run reach every unit (a main evaluation, probes, reduced evaluations,
    training steps); both predictions are dynamics.core.cost's on the reported unit costs."""
    result = gpu_check["paper_shape"]
    assert (result["model"]["scale"], result["seq"], result["batch"], result["seconds_budget"]) == (
        0.005,
        32,
        1,
        5,
    )
    assert result["model"]["num_hidden_layers"] == 1 and result["model"]["lora_rank"] == 32
    assert result["paper_seq_and_batch"] is False
    assert (
        result["evaluation"]["main_batches"] == 200
        and result["evaluation"]["reduced_batches"] == 50
    )
    measured, predicted = result["measured"], result["predicted_2048_steps"]
    units = measured["unit_s"]
    for unit in UNITS:
        assert (
            measured["counts"][unit] > 0
            and units[unit] == measured["total_s"][unit] / measured["counts"][unit]
        )
    assert measured["reasons"] == {}
    n, m = result["N_datasets"], result["M_domains"]
    schedule = build_schedule("dense-warmup", 2048)
    ratio = units["train_step"] / (units["main_evaluation"] / (m * 200))
    assert predicted["measured_train_fwd_ratio"] == pytest.approx(ratio, rel=1e-12)
    model = CostModel(train_fwd_ratio=ratio)
    assert predicted["measured_train_fwd_ratio_model"]["relative_cost"] == pytest.approx(
        relative_cost(schedule, n, m, model), rel=1e-12
    )
    cost = run_cost(schedule, n, m, model)
    fixed = sum(h * units["train_step"] + h / 64 * units["main_evaluation"] for h in cost.horizons)
    added = sum(
        n * (c * units["probe_step"] + units["reduced_evaluation"])
        + (0 if recycled else units["reduced_evaluation"])
        for c, recycled in zip(cost.probe_budgets, cost.recycled, strict=True)
    )
    assert predicted["all_measured_units"]["relative_cost"] == pytest.approx(
        (fixed + added) / fixed, rel=1e-12
    )
    assert predicted["paper_relative_cost"] == 1.7


def test_the_paper_shape_reports_nothing_it_did_not_measure(run_overhead, monkeypatch, capsys):
    """With no time, nothing runs: every unit and every prediction that needs one is null,
    with the reason (the script's main in this process: nothing trains, nothing to isolate)."""
    monkeypatch.setattr(sys, "argv", [*PAPER_TOY, "--seconds", "0"])
    run_overhead.main()
    result = json.loads(capsys.readouterr().out)
    measured, predicted = result["measured"], result["predicted_2048_steps"]
    assert measured["steps_trained"] == 0 and set(measured["counts"].values()) == {0}
    for unit in UNITS:
        assert measured["unit_s"][unit] is None
        assert (
            "--seconds 0 ran out before the training steps timed first" in measured["reasons"][unit]
        )
    assert predicted["measured_train_fwd_ratio"] is None and predicted["reason_train_fwd_ratio"]
    assert (
        predicted["all_measured_units"] is None
        and "train_step" in predicted["reason_all_measured_units"]
    )


def test_the_four_unit_prediction_is_the_cost_model_when_units_follow_its_assumptions(run_overhead):
    """A probe step costing a training step and a reduced evaluation 50/200 of a main one:
    the four-unit formula gives cost.py's relative cost (here with C_bp = 3 C_fwd)."""
    n, m = 3, 4
    units = {
        "train_step": 3.0,
        "main_evaluation": m * 200.0,
        "probe_step": 3.0,
        "reduced_evaluation": m * 50.0,
    }
    predicted = run_overhead.predictions(units, n, m)
    expected = relative_cost(build_schedule("dense-warmup", 2048), n, m, CostModel())
    assert predicted["all_measured_units"]["relative_cost"] == pytest.approx(expected, rel=1e-12)
    assert predicted["measured_train_fwd_ratio"] == pytest.approx(3.0)
    assert predicted["measured_train_fwd_ratio_model"]["relative_cost"] == pytest.approx(
        expected, rel=1e-12
    )


def test_the_fsdp_resume_check_resumes_a_run_to_the_same_evaluations():
    """benchmarks/fsdp_resume.py, unsharded (accelerate shards only on GPUs): a finished run's
    copy, its summary removed, resumes from its last resume point to the same evaluations."""
    check = Child("benchmarks/fsdp_resume.py", ["--no-fsdp"])
    assert check.wait(timeout=900) == 0, check.stderr()[-3000:]
    result = json.loads(check.stdout())
    assert result["fsdp"] is False
    assert result["resumed_from_step"] == 8 and result["resumed_at"] == [8]
    assert result["evaluations"] == 4  # steps 0, 4, 8, 12
    assert result["max_relative_difference_resumed_vs_uninterrupted"] == 0.0
    # LoRA rank 8 on every projection of a model of hidden size 32 (keys and values 16, the
    # MLP 64): whole A and B matrices.
    assert result["adapter_shapes"] == ["16x8", "32x8", "64x8", "8x32", "8x64"]

"""The run report's account of target data: how much of the run trained on it, the stretch
at the end without any, the updates where no mixture was predicted feasible, and the hint
toward ``target_floor`` only where it can help."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamics.report.text import run_report, target_data_lines
from dynamics.runs.rundir import RunRecords

TOTAL_STEPS = 64


def _update(step: int, horizon: int, target_weight: float, feasible: bool, robust: dict | None) -> dict:
    update = {
        "step": step,
        "horizon": horizon,
        "weights": [target_weight, 1.0 - target_weight, 0.0],
        "solver": {"feasible": feasible},
        "extra": {},
    }
    if robust is not None:
        # The robust variant's own verdict decides; the nominal solver's may differ.
        update["solver"]["feasible"] = not feasible
        update["extra"]["robust"] = {"feasible": feasible, **robust}
    return update


def _records(*, robust: dict | None = None, kept: bool = True, last_horizon: int = 32, fixed: bool = False) -> RunRecords:
    """A 64-step run of datasets math (the target), code and prose against a constraint:
    all target data for 8 steps, half for 8, none from step 16 on, and at step 16 no
    mixture predicted feasible. The last update's horizon runs past the end with 64."""
    updates = [
        _update(0, 8, 1.0, True, robust),
        _update(8, 8, 0.5, True, robust),
        _update(16, 16, 0.0, False, robust),
        _update(32, last_horizon, 0.0, True, robust),
    ]
    if fixed:
        updates = [{"step": 0, "horizon": TOTAL_STEPS, "weights": [0.1, 0.45, 0.45], "solver": None, "extra": {}}]
    summary = {
        "method": "fixed" if fixed else "dynamics",
        "dataset_names": ["math", "code", "prose"],
        "domain_names": ["math", "code-heldout"],
        "targets": [0],
        "constraints": [1],
        "total_steps": TOTAL_STEPS,
        "best_checkpoint": {"step": 8} if kept else None,
    }
    return RunRecords(path=Path("run"), summary=summary, evaluations=[], updates=updates)


@pytest.mark.parametrize("last_horizon", [32, 64])
def test_the_share_the_dry_stretch_and_the_updates_without_a_feasible_mixture(last_horizon):
    lines = target_data_lines(_records(last_horizon=last_horizon))
    # 8 steps of target data, then 4 of 8; the last horizon counts only to the run's end.
    assert lines[0] == "target data: 18.8% of the 64 steps (math 18.8%); none from step 16 to the end (48 steps)"
    assert lines[1].startswith("no mixture was predicted to keep every constraint at 1 of 4 updates (steps 16)")
    assert lines[2].startswith("hint: ") and "method.target_floor: 0.02" in lines[2]
    assert len(lines) == 3


def test_the_robust_verdict_decides_and_a_floor_already_set_gets_no_hint():
    lines = target_data_lines(_records(robust={"target_floor": 0.0}))
    assert "at 1 of 4 updates (steps 16)" in lines[1] and lines[2].startswith("hint: ")
    floored = target_data_lines(_records(robust={"target_floor": 0.02}))
    assert floored == lines[:2]


def test_no_hint_where_no_checkpoint_kept_the_constraints():
    """Where nothing was feasible, more target data breaks the constraints more."""
    lines = target_data_lines(_records(kept=False))
    assert len(lines) == 2 and not any(line.startswith("hint") for line in lines)


def test_a_fixed_mixture_and_a_run_without_target_data_get_no_account():
    assert target_data_lines(_records(fixed=True)) == []
    records = _records()
    records.summary["dataset_names"] = ["algebra", "code", "prose"]  # no dataset named like the target
    assert target_data_lines(records) == []


def test_the_report_of_a_finished_run_carries_the_account():
    records = _records()
    records.summary.update(
        num_updates=4, train_seconds=1.0, predicted_cost=2.0, cost_assumption="", domain_metrics=["loss", "loss"],
        constrained_ppl_reduction=0.1, best_checkpoint={"step": 8, "path": "best_checkpoint"},
    )
    report = run_report(records)
    assert "\n".join(target_data_lines(records)) in report

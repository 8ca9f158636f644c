"""The sweep report's numbers on hand-made run results, checked by hand (no training)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from dynamics.core import metrics
from dynamics.report.plotting import plot_weights, pyplot, save
from dynamics.report.sweep import (
    FIXED,
    RunResult,
    aggregate,
    find_run_folders,
    method_label,
    write_sweep_figures,
)
from dynamics.runs import rundir
from dynamics.runs.rundir import RunRecords
from tests.report.lines import update

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def result(
    scenario: str,
    method: str,
    mixture: str,
    seed: int,
    reduction: float,
    violation: float,
    constraints: int,
) -> RunResult:
    path = Path("/sweep") / scenario / (method if method != "fixed" else mixture) / f"seed{seed}"
    records = RunRecords(
        path=path,
        summary={"total_steps": 8, "dataset_names": ["a", "b"]},
        evaluations=[],
        updates=[update(0, [0.5, 0.5]), update(4, [0.9, 0.1])],
    )
    return RunResult(
        path=path,
        scenario_key=scenario,
        method=method,
        mixture=mixture,
        seed=seed,
        feasible=reduction > 0,
        reduction=reduction,
        predicted_cost=1.5 if method != "fixed" else 1.0,
        train_seconds=10.0,
        num_constraints=constraints,
        max_violation=violation,
        records=records,
    )


DYN = "dynamics-dense-warmup"
RESULTS = [
    # Scenario A (2 constraints): DynaMiCS feasible on both seeds; the fixed w1 fails on seed 1.
    result("A", DYN, DYN, 0, 0.20, -0.01, 2),
    result("A", DYN, DYN, 1, 0.10, -0.02, 2),
    result("A", "fixed", "w1", 0, 0.05, -0.01, 2),
    result("A", "fixed", "w1", 1, 0.00, 0.30, 2),
    result("A", "fixed", "w2", 0, 0.15, -0.01, 2),
    result("A", "fixed", "w2", 1, 0.12, -0.01, 2),
    # Scenario B (3 constraints): nothing is feasible anywhere.
    result("B", DYN, DYN, 0, 0.0, 0.1, 3),
    result("B", DYN, DYN, 1, 0.0, 0.3, 3),
    result("B", "fixed", "w1", 0, 0.0, 0.5, 3),
    result("B", "fixed", "w1", 1, 0.0, 0.7, 3),
    result("B", "fixed", "w2", 0, 0.0, 0.2, 3),
    result("B", "fixed", "w2", 1, 0.0, 0.4, 3),
]


def test_oracle_best_at_k_feasible_at_k_and_violations_follow_the_paper():
    numbers = aggregate(RESULTS)
    a, b = numbers["scenarios"]["A"], numbers["scenarios"]["B"]
    assert a["fixed"]["oracle_reduction"] == pytest.approx(
        (0.15 + 0.12) / 2
    )  # best mixture per seed, then mean
    assert b["fixed"]["oracle_reduction"] == 0.0
    assert a["methods"][DYN]["reduction"] == pytest.approx(0.15)
    assert numbers["methods"][DYN] == {
        "scenarios": 2,
        "median_reduction": pytest.approx(0.075),
        # Per seed, the median over scenarios: seed 0 (0.2 + 0) / 2, seed 1 (0.1 + 0) / 2;
        # their std.
        "median_reduction_std_over_seeds": pytest.approx(np.std([0.1, 0.05])),
        "feasibility_rate": 0.5,
        "feasibility_rate_std_over_seeds": 0.0,
        "median_predicted_cost": 1.5,
    }
    pools = [[0.05, 0.0, 0.15, 0.12], [0.0] * 4]
    assert numbers["fixed"]["best_at_k"]["3"] == pytest.approx(
        (metrics.best_at_k(pools[0], 3) + 0.0) / 2
    )
    assert numbers["fixed"]["feasible_at_k"]["1"] == pytest.approx((0.75 + 0.0) / 2)
    assert numbers["fixed"]["feasible_at_k"]["2"] == pytest.approx((1 - 0.25**2) / 2)
    assert numbers["fixed"]["mixtures"] == 2
    assert numbers["by_constraints"] == {
        "2": {DYN: [pytest.approx(0.15)], FIXED: [pytest.approx(0.135)]},
        "3": {DYN: [0.0], FIXED: [0.0]},
    }
    # Only B is jointly infeasible; the baselines' value is their least violating mixture (w2).
    assert numbers["violation_jointly_infeasible"] == {
        DYN: {"B": {"method": pytest.approx(0.2), "fixed": pytest.approx(0.3)}}
    }


def test_sweep_figures_are_written(tmp_path):
    files = write_sweep_figures(aggregate(RESULTS), RESULTS, tmp_path)
    assert set(files) == {"reduction", "cost", "by_constraints", "violation", f"weights:{DYN}"}
    for name in files.values():
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize(
    ("method", "label"),
    [
        (
            {
                "name": "dynamics",
                "schedule": "dense-warmup",
                "variant": "paper",
                "predictor": "linear",
            },
            "dynamics-dense-warmup",
        ),
        (
            {"name": "dynamics", "schedule": "fixed:8", "variant": "robust", "predictor": "curve"},
            "dynamics-fixed8-robust-curve",
        ),
        ({"name": "dynamics", "schedule": [0, 4]}, "dynamics-steps0-4"),
        ({"name": "gradient-alignment", "schedule": "no-warmup"}, "gradient-alignment-no-warmup"),
        ({"name": "fixed", "weights": {"a": 1.0}, "schedule": [0]}, "fixed"),
    ],
)
def test_method_labels(method, label):
    assert method_label(method) == label


@pytest.mark.parametrize("index", [0, 2])  # a DynaMiCS run, a fixed mixture
def test_the_same_run_twice_is_refused_instead_of_overwriting_a_seed(index):
    # What two sweep folders of one sweep file give: same scenario, method and seed, other paths.
    again = dataclasses.replace(
        RESULTS[index], path=Path("/other-sweep") / RESULTS[index].path.relative_to("/sweep")
    )
    what = f"method {DYN}" if index == 0 else "fixed mixture w1"
    message = (
        f"{RESULTS[index].path} and {again.path} are the same run (the same config, {what}, "
        "seed 0): "
        "report them separately (one dynamics report each), or leave one of them out"
    )
    with pytest.raises(rundir.RunDirError, match=re.escape(message)):
        aggregate([*RESULTS, again])


def test_a_run_folder_given_twice_is_read_once(tmp_path):
    run = tmp_path / "sweep" / "c" / "m" / "seed0"
    run.mkdir(parents=True)
    (run / rundir.CONFIG_FILE).write_text("{}")
    (run / rundir.SUMMARY_FILE).write_text("{}")
    assert find_run_folders([tmp_path / "sweep", run]) == (
        [tmp_path / "sweep" / "c" / "m" / "seed0"],
        [],
    )


def test_a_failed_save_leaves_no_file_and_closes_the_figure(tmp_path):
    plt = pyplot()
    fig = plt.figure()

    def failing_savefig(path, **kwargs):
        Path(path).write_bytes(b"half a PNG")
        raise OSError("disk full")

    fig.savefig = failing_savefig
    with pytest.raises(OSError, match="disk full"):
        save(fig, tmp_path, "figure.png")
    assert list(tmp_path.iterdir()) == []
    assert not plt.fignum_exists(fig.number)


def test_weight_lines_cycle_through_the_dashes_past_four_datasets():
    names = ["a", "b", "c", "d", "e"]
    records = RunRecords(
        path=Path("/run"),
        summary={"total_steps": 8, "dataset_names": names},
        evaluations=[],
        updates=[
            update(0, [0.2] * 5),
            update(4, [0.6, 0.1, 0.1, 0.1, 0.1]),
        ],
    )
    fig, ax = pyplot().subplots()
    plot_weights(ax, records)
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == names
    assert [line.get_linestyle() for line in lines] == ["-", "--", ":", "-.", "-"]
    assert list(lines[0].get_xdata()) == [0, 4, 8] and list(lines[0].get_ydata()) == [0.2, 0.6, 0.6]
    pyplot().close(fig)

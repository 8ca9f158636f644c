"""What the run folder's writer (``dynamics.runs.writer.RunFolder``) puts in ``metrics.jsonl``,
``controller.jsonl`` and ``summary.json`` reads back (``dynamics.runs.rundir.read_run``) into
the records of ``dynamics.core.records`` it was written from, every field typed, and a line
that is not such a record is refused with the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dynamics.core.records import (
    CheckpointRecord,
    EvaluationLine,
    EvaluationRecord,
    RunHistory,
    UpdateRecord,
)
from dynamics.core.rules import ChoiceRecord, RulesRecord
from dynamics.core.rules.target_floor import FloorDecision, TargetFloorRecord
from dynamics.runs import rundir
from dynamics.runs.writer import RunFolder

DATASETS = ["math", "wiki"]
DOMAINS = ["math", "orca"]


def history() -> RunHistory:
    """Two main evaluations and two updates of a run on token shares: the first update
    carries every detail a policy records, the second was abandoned by a backtrack."""
    run = RunHistory(DATASETS, DOMAINS, targets=(0,), constraints=(1,))
    run.evaluations = [
        EvaluationRecord(0, np.array([2.0, 1.0]), np.array([2.1, 1.1]), np.array([0.5, 0.5])),
        EvaluationRecord(
            4,
            np.array([1.5, 0.9]),
            np.array([1.6, 1.0]),
            np.array([0.7, 0.3]),
            wall_seconds=0.25,
            eval_batches=np.array([[1.4, 1.6], [0.8, 1.0]]),
        ),
    ]
    run.updates = [
        UpdateRecord(
            policy="dynamics",
            step=0,
            horizon=4,
            probe_budget=2,
            weights=np.array([0.7, 0.3]),
            current_losses=np.array([2.0, 1.0]),
            recycled_anchor=True,
            slope_matrix=np.array([[-0.1, np.nan], [0.01, np.nan]]),
            predicted_losses=np.array([1.6, 1.04]),
            solver={"feasible": True, "lambda": 0.5},
            realized_losses=np.array([1.5, 0.9]),
            probe_seconds=0.5,
            dataset_probe_seconds=np.array([0.2, 0.3]),
            probe_ranks=[[0], [0]],
            predictor="linear",
            slope_models=[["linear", None], ["linear", None]],
            extrapolation_guarded=[[False, None], [False, None]],
            slope_errors=np.array([[0.01, np.nan], [0.002, np.nan]]),
            accuracy_slopes="expected",
            batch_shares=np.array([0.6, 0.4]),
            unreliable_datasets=["wiki"],
            rules=RulesRecord(
                (TargetFloorRecord(0.02, FloorDecision(0.02, [0], [])),),
                ChoiceRecord([0.6, 0.4], "direct", True, 0.0, -1.5),
            ),
            margins={"orca": 0.01},
        ),
        UpdateRecord(
            policy="dynamics",
            step=4,
            horizon=4,
            probe_budget=2,
            weights=np.array([0.5, 0.5]),
            current_losses=np.array([1.5, 0.9]),
            recycled_anchor=False,
            abandoned=True,
            backtrack={"from_step": 8, "to_step": 4},
        ),
    ]
    return run


def written(tmp_path: Path) -> Path:
    """A run folder whose logs and summary the writer wrote from :func:`history`."""
    run = history()
    folder = RunFolder(tmp_path, "dynamics run --resume", selection_margin=0.0)
    for record in run.evaluations:
        folder.write_evaluation(record, run)
    folder.write_updates(run)
    best = CheckpointRecord(4, {"math": 1.5, "orca": 0.9}, {"math": 1.6, "orca": 1.0}, "best")
    summary = {
        "dataset_names": DATASETS,
        "domain_names": DOMAINS,
        "targets": [0],
        "constraints": [1],
        "best_checkpoint": best.to_dict(),
    }
    rundir.write_json(tmp_path / rundir.SUMMARY_FILE, summary)
    return tmp_path


def assert_same(read: UpdateRecord, wrote: UpdateRecord) -> None:
    for name, value in vars(wrote).items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(getattr(read, name), value, err_msg=name)
        else:
            assert getattr(read, name) == value, name


def test_every_update_field_reads_back_into_the_record_it_was_written_from(tmp_path):
    records = rundir.read_run(written(tmp_path))
    wrote = history().updates
    assert all(isinstance(u, UpdateRecord) for u in records.updates)
    for read, original in zip(records.updates, wrote, strict=True):
        assert_same(read, original)
    # The rules' record is read back typed, the same as written; the paper's has none.
    assert records.updates[0].rules == wrote[0].rules
    assert records.updates[1].rules is None
    assert records.kept_updates == records.updates[:1]
    np.testing.assert_array_equal(records.updates[0].trained_shares, [0.6, 0.4])
    np.testing.assert_array_equal(records.updates[1].trained_shares, [0.5, 0.5])


def test_the_policy_details_and_the_loop_marks_are_held_in_the_lines_extra_object(tmp_path):
    line = json.loads((written(tmp_path) / rundir.CONTROLLER_FILE).read_text().splitlines()[0])
    assert line["dataset_names"] == DATASETS
    assert sorted(line["extra"]) == [
        "accuracy_slopes",
        "batch_shares",
        "extrapolation_guarded",
        "margins",
        "predictor",
        "robust",
        "slope_errors",
        "slope_models",
        "unreliable_datasets",
    ]
    assert line["extra"]["slope_errors"] == [[0.01, None], [0.002, None]]  # NaN as null
    assert line["extra"]["robust"]["source"] == "direct"
    assert line["extra"]["robust"]["target_floor"] == 0.02
    assert "batch_shares" not in line and "abandoned" not in line["extra"]
    assert line["prediction_error"] == pytest.approx([-0.1, -0.14])


def test_evaluation_lines_and_the_best_checkpoint_read_back_typed(tmp_path):
    records = rundir.read_run(written(tmp_path))
    first, second = records.evaluations
    assert isinstance(second, EvaluationLine)
    assert second.eval == {"math": 1.5, "orca": 0.9} and second.test == {"math": 1.6, "orca": 1.0}
    assert second.weights == {"math": 0.7, "wiki": 0.3}
    assert second.constraint_slack == {"orca": pytest.approx(0.1)}
    assert second.feasible and not second.backtracked and second.wall_seconds == 0.25
    assert second.target_loss_sum == 1.5
    assert second.eval_batches == {"math": [1.4, 1.6], "orca": [0.8, 1.0]}
    assert first.eval_batches is None and not first.feasible  # step 0 is the reference
    assert EvaluationLine.from_dict(second.to_dict()) == second
    assert records.best_checkpoint == CheckpointRecord(
        4, {"math": 1.5, "orca": 0.9}, {"math": 1.6, "orca": 1.0}, "best"
    )


def test_a_controller_line_with_an_unknown_extra_entry_is_refused_with_its_line(tmp_path):
    folder = written(tmp_path)
    path = folder / rundir.CONTROLLER_FILE
    lines = path.read_text().splitlines()
    line = json.loads(lines[1])
    line["extra"]["solver_temperature"] = 0.5
    path.write_text("\n".join([lines[0], json.dumps(line)]) + "\n")
    with pytest.raises(rundir.RunDirError) as error:
        rundir.read_run(folder)
    message = str(error.value)
    assert f"{path}, line 2: not a record this version of dynamics reads" in message
    assert "extra.solver_temperature" in message and "\n" not in message

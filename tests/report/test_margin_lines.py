"""The run report's account of how far the kept checkpoint's constraints clear their
references, in standard errors of their change on the eval batches."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dynamics.core.records import EvaluationLine
from dynamics.report.text import margin_lines
from dynamics.runs.rundir import RunRecords
from tests.report.lines import evaluation

NAMES = ["math", "code-heldout", "quiz"]


def _row(step: int, batches: dict[str, list[float]]) -> EvaluationLine:
    means = {name: sum(values) / len(values) for name, values in batches.items()}
    return evaluation(step, means, batches)


def _records(rows: list[EvaluationLine]) -> RunRecords:
    summary = {
        "domain_names": NAMES,
        "domain_metrics": ["loss", "loss", "accuracy"],
        "dataset_names": ["math", "code"],
        "targets": [0],
        "constraints": [1, 2],
    }
    return RunRecords(path=Path("run"), summary=summary, evaluations=rows, updates=[])


BASE = _row(0, {"math": [2.0] * 4, "code-heldout": [1.0] * 4, "quiz": [-0.5] * 4})


def test_a_constraint_within_two_errors_of_its_reference_is_named():
    # code-heldout: -0.005 on average, per batch -0.01, 0, -0.03, +0.02 (error 0.0104): 0.5
    # errors; the quiz gained one answer in one batch of four.
    later = _row(
        8,
        {
            "math": [1.5] * 4,
            "code-heldout": [0.99, 1.0, 0.97, 1.02],
            "quiz": [-0.75, -0.5, -0.5, -0.5],
        },
    )
    first, note = margin_lines(_records([BASE, later]), 8)
    assert first == (
        "its slack on the eval split, in standard errors of the change: "
        "code-heldout +0.0050 (+0.5 errors), quiz +0.0625 (+1.0 errors)"
    )
    assert note.startswith("note: code-heldout, quiz hold by less than 2 errors of 4 eval batches")
    assert note.endswith("more evaluation.batches narrow the error (4x the batches halve it)")


def test_a_constraint_with_room_or_unchanged_is_not_named():
    later = _row(
        8, {"math": [1.5] * 4, "code-heldout": [0.95, 0.96, 0.95, 0.94], "quiz": [-0.5] * 4}
    )
    (line,) = margin_lines(_records([BASE, later]), 8)
    assert line.endswith(
        "code-heldout +0.0500 (+12.2 errors), quiz +0.0000 (unchanged on every batch)"
    )


def test_a_run_without_per_batch_values_says_nothing_of_them():
    assert BASE.eval_batches is not None
    rows = [
        dataclasses.replace(row, eval_batches=None) for row in (BASE, _row(8, BASE.eval_batches))
    ]
    assert margin_lines(_records(rows), 8) == []

"""The run report's table of mixture updates: one line per update of ``controller.jsonl`` with
its step, horizon and weights, and the columns the update record's definition names
(``UpdateRecord.report_columns``)."""

from __future__ import annotations

from pathlib import Path

from dynamics.core.records import UpdateRecord
from dynamics.report.text import run_report, update_lines
from dynamics.runs.rundir import RunRecords
from tests.report.lines import update

SUMMARY = {
    "method": "dynamics",
    "dataset_names": ["math", "wiki"],
    "domain_names": ["math", "orca"],
    "domain_metrics": ["loss", "loss"],
    "targets": [0],
    "constraints": [1],
    "total_steps": 8,
    "num_updates": 2,
}


def records() -> RunRecords:
    updates = [
        update(0, [0.75, 0.25], probe_seconds=1.23456),
        update(4, [0.5, 0.5], probe_seconds=0.5, abandoned=True),
    ]
    return RunRecords(
        path=Path("run"), summary=SUMMARY, evaluations=[], updates=updates, finished=False
    )


def test_the_probe_seconds_are_a_report_column_of_the_update_record():
    assert ("probe seconds", "probe_seconds") in UpdateRecord.report_columns()
    assert "weights" not in {name for _, name in UpdateRecord.report_columns()}


def cells(line: str, header: str) -> dict[str, str]:
    """A table line's cells under each column title of ``header``: a title starts where its
    column does, after the two spaces between columns."""
    starts = [k for k, c in enumerate(header) if c != " " and (k == 0 or header[k - 2 : k] == "  ")]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): line[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def test_each_update_gets_a_line_with_its_columns_and_abandoned_ones_say_so():
    header, first, second = update_lines(records())
    titles = ["update", "horizon", *[title for title, _ in UpdateRecord.report_columns()]]
    assert list(cells(first, header)) == [*titles, "weights"]
    assert cells(first, header)["update"] == "0" and cells(first, header)["horizon"] == "4"
    assert cells(first, header)["probe seconds"] == "1.235"
    assert cells(first, header)["weights"] == "math=0.75 wiki=0.25"
    assert cells(second, header)["update"] == "4 (abandoned)"
    assert cells(second, header)["probe seconds"] == "0.5"
    assert "\n".join([header, first, second]) in run_report(records())


def test_a_run_without_updates_has_no_table():
    empty = RunRecords(path=Path("run"), summary=SUMMARY, evaluations=[], updates=[])
    assert update_lines(empty) == []

"""The Trainer examples run as a user runs them: ``python examples/SCRIPT`` from the
repository root, in a process of its own (tests.fixtures.preloaded)."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.preloaded import Child

pytestmark = pytest.mark.slow  # each example trains in a process of its own


@pytest.mark.parametrize("script", ["trainer.py", "trl_sft.py"])
def test_each_trainer_example_writes_a_run_folder(tmp_path, script):
    out = tmp_path / "run"
    example = Child(f"examples/{script}", ["--out", str(out)])
    assert example.wait(timeout=600) == 0, example.stderr()[-3000:]
    assert f"run folder: {out}" in example.stdout()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer"] is True and summary["total_steps"] == 32
    assert (out / "controller.jsonl").read_text().count(
        "\n"
    ) == 6  # dense warmup over 32 steps: 0, 1, 2, 4, 8, 16

"""What reaches the experiment trackers: a run with TensorBoard on, its event file read back."""

from __future__ import annotations

import json

import pytest

from dynamics.engine.config import RunConfig
from dynamics.engine.run import run
from dynamics.engine.tracking import start_trackers
from tests.engine.test_run import tiny_config

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def scalars(folder) -> dict[str, dict[int, float]]:
    events = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def test_trackers_receive_evaluations_updates_probe_times_loss_and_lr(
    tokenizer_dir, tmp_path, capsys
):
    data = tiny_config(tokenizer_dir, tmp_path / "run")
    data["trackers"] = ["tensorboard"]
    data["tracker_project"] = "mixtures"
    data["optimizer"]["lr_schedule"] = "linear"
    run(RunConfig.from_dict(data), progress=True)
    # The progress bar names each phase, not only training steps.
    shown = capsys.readouterr().err
    assert all(
        f"dynamics · {phase}" in shown for phase in ("evaluation", "probing + solving", "training")
    )

    logged = scalars(tmp_path / "run" / "mixtures")  # TensorBoard writes under the project's name
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    updates = [
        json.loads(line)
        for line in (tmp_path / "run" / "controller.jsonl").read_text().splitlines()
    ]
    assert [row["step"] for row in rows] == [0, 4, 8]
    for row in rows:
        step = row["step"]
        for domain, value in row["eval"].items():
            assert logged[f"eval/{domain}"][step] == pytest.approx(value, rel=1e-6)
        for domain, value in row["test"].items():
            assert logged[f"test/{domain}"][step] == pytest.approx(value, rel=1e-6)
        for constraint, value in row["constraint_slack"].items():
            assert logged[f"slack/{constraint}"][step] == pytest.approx(value, rel=1e-6, abs=1e-7)
        assert logged["worst_slack"][step] == pytest.approx(
            min(row["constraint_slack"].values()), abs=1e-7
        )
        assert logged["feasible"][step] == float(row["feasible"])
        assert logged["target_loss_sum"][step] == pytest.approx(row["target_loss_sum"], rel=1e-6)
        assert logged["evaluation_seconds"][step] == pytest.approx(row["wall_seconds"], rel=1e-6)
    for update in updates:
        step = update["step"]
        for name, weight in zip(update["dataset_names"], update["weights"], strict=True):
            # An update at an evaluation step logs the same weights the evaluation row holds.
            assert logged[f"weight/{name}"][step] == pytest.approx(weight, abs=1e-6)
            probe = update["dataset_probe_seconds"][update["dataset_names"].index(name)]
            assert logged[f"probe_seconds/{name}"][step] == pytest.approx(probe, rel=1e-6)
        assert logged["probe_seconds"][step] == pytest.approx(update["probe_seconds"], rel=1e-6)
    # The loss and learning rate after every training stretch (the schedule splits 0-8 at 2 and 4).
    assert sorted(logged["train/loss"]) == sorted(logged["train/lr"]) == [2, 4, 8]
    assert all(v > 0 for v in logged["train/loss"].values())
    # The linear schedule's rate after 2, 4 and 8 of 8 steps.
    assert [logged["train/lr"][s] for s in (2, 4, 8)] == pytest.approx([0.75e-2, 0.5e-2, 0.0])


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def init_trackers(self, project: str, config: dict, init_kwargs: dict) -> None:
        self.calls.append((project, init_kwargs))


def test_the_run_name_goes_to_wandb_and_mlflow(tokenizer_dir, tmp_path):
    data = tiny_config(tokenizer_dir, tmp_path / "runs" / "s28-seed0")
    data["trackers"] = ["wandb", "mlflow"]
    recorder = Recorder()
    start_trackers(recorder, RunConfig.from_dict(data))  # type: ignore[arg-type]
    assert recorder.calls == [
        ("dynamics", {"wandb": {"name": "s28-seed0"}, "mlflow": {"run_name": "s28-seed0"}})
    ]
    data["tracker_run_name"] = "named"
    data["trackers"] = ["tensorboard"]
    recorder = Recorder()
    start_trackers(recorder, RunConfig.from_dict(data))  # type: ignore[arg-type]
    assert recorder.calls == [("dynamics", {})]

"""Crash-safe resume with real processes: a `dynamics run` is SIGKILLed at chosen moments
(a probe, a main evaluation, a training stretch, a save, the swap of a save, the swap of a
best checkpoint) in a process of
its own on one thread (tests.fixtures.preloaded), resumed with
`dynamics run --resume DIR` (in the test's own process, on one thread), and its files
compared with an uninterrupted run's."""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import safetensors.torch
import torch
import yaml

from dynamics.cli import main as cli_main
from dynamics.runs import state as run_state
from tests.engine.test_run import tiny_config
from tests.fixtures.in_process import cli_here
from tests.fixtures.preloaded import Child

pytestmark = pytest.mark.slow


def resumable_config(tokenizer_dir: Path, out: Path) -> dict:
    data = tiny_config(tokenizer_dir, out, variant="robust", backtrack=1)
    data["method"]["schedule"] = [0, 2, 4, 8]
    data["training"].update(total_steps=12, checkpoint_interval=2)
    return data


def killed_run(*args: str, kill: tuple[str, int]) -> tuple[int | None, str]:
    """``dynamics ARGS`` in a process of its own, SIGKILLed at ``kill`` (tests.engine.kill_run):
    its exit status and stderr."""
    child = Child("tests.engine.kill_run", [kill[0], str(kill[1]), *args])
    return child.wait(timeout=600), child.stderr()  # None: still running at 600 s, and killed


def resume_here(run_folder: Path) -> None:
    """``dynamics run --resume RUN_FOLDER`` in this process, on one thread as every run here."""
    cli_here("run", "--resume", str(run_folder), "--no-progress")


def comparable(run_folder: Path) -> dict:
    """Everything a run leaves that must not depend on being interrupted: both logs without
    wall times, the summary's results, and the best checkpoint's tensors."""

    def rows(name: str) -> list[dict]:
        lines = (run_folder / name).read_text().splitlines()
        return [
            {k: v for k, v in json.loads(line).items() if not k.endswith("_seconds")}
            for line in lines
        ]

    summary = json.loads((run_folder / "summary.json").read_text())
    adapter = safetensors.torch.load_file(
        str(run_folder / "best_checkpoint" / "adapter_model.safetensors")
    )
    return {
        "metrics": rows("metrics.jsonl"),
        "controller": rows("controller.jsonl"),
        "summary": {
            k: summary[k]
            for k in ("feasible", "constrained_ppl_reduction", "best_checkpoint", "backtracks")
        },
        "adapter": {k: v.tolist() for k, v in adapter.items()},
    }


def _started_until_first_resume_point(base: Path, out: Path) -> tuple[Child, float]:
    """``dynamics run`` of the reference config in a process of its own, returned once its
    first resume point exists, with the time that happened."""
    child = Child(
        "dynamics.cli", ["run", str(base / "config.yaml"), "--out", str(out), "--no-progress"]
    )
    while not (out / run_state.RESUME_DIR).exists():
        assert child.poll() is None, (
            f"the run ended before its first resume point: {child.stderr()[-3000:]}"
        )
        time.sleep(0.01)
    return child, time.perf_counter()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict, float]:
    """The tokenizer, the files of one uninterrupted run, and how long this machine took
    from that run's first resume point to its summary (its last file)."""
    from tests.fixtures.tiny_tokenizer import tiny_tokenizer

    base = tmp_path_factory.mktemp("resume")
    tiny_tokenizer().save_pretrained(base / "tokenizer")
    config = base / "config.yaml"
    config.write_text(yaml.safe_dump(resumable_config(base / "tokenizer", base / "reference")))
    process, since = _started_until_first_resume_point(base, base / "reference")
    while not (base / "reference" / "summary.json").exists():
        assert process.poll() is None, (
            f"the reference run ended without a summary: {process.stderr()[-3000:]}"
        )
        time.sleep(0.01)
    remaining = time.perf_counter() - since
    assert process.wait(timeout=600) == 0, process.stderr()[-3000:]
    files = comparable(base / "reference")
    # The run must exercise what a resume restores: a feasible best checkpoint, updates at
    # several resume points, and a backtrack (its margins and the feasible snapshot).
    assert files["summary"]["feasible"]
    assert files["summary"]["backtracks"]
    return base, files, remaining


KILL_POINTS = [("probe", 5), ("probe", 11), ("evaluate", 3), ("train", 6), ("save", 2), ("swap", 3)]
# As the first best checkpoint that replaces another is swapped in (step 8's over step 4's):
# just before the exchange, and just after it (the one before not yet deleted).
BEST_SWAP_KILLS = [("best-new", 1), ("best-swap", 1)]


@pytest.fixture(scope="module")
def killed_runs(reference) -> dict[tuple[str, int], tuple[Path, tuple[int | None, str]]]:
    """The reference config killed at each point of KILL_POINTS and BEST_SWAP_KILLS: two runs at a
    time (one thread each, in their own folders), after the reference, which times itself alone."""
    base = reference[0]

    def killed(kill: tuple[str, int]) -> tuple[Path, tuple[int | None, str]]:
        out = base / f"killed-{kill[0]}-{kill[1]}"
        return out, killed_run(
            "run", str(base / "config.yaml"), "--out", str(out), "--no-progress", kill=kill
        )

    kills = KILL_POINTS + BEST_SWAP_KILLS
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(kills, pool.map(killed, kills), strict=True))


@pytest.mark.parametrize("kill", KILL_POINTS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_a_killed_run_resumes_to_the_same_files(reference, killed_runs, kill):
    _, expected, _ = reference
    out, (code, stderr) = killed_runs[kill]
    assert code == -9, stderr  # really killed, mid-run
    assert not (out / "summary.json").exists()
    assert run_state.find_resume_point(out) is not None
    resume_here(out)
    assert comparable(out) == expected
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["resumed_at"]) == 1


@pytest.mark.parametrize("kill", BEST_SWAP_KILLS, ids=lambda k: k[0])
def test_a_run_killed_while_its_best_checkpoint_is_swapped_keeps_one_that_loads(
    reference, killed_runs, kill
):
    base, expected, _ = reference
    out, (code, stderr) = killed_runs[kill]
    assert code == -9, stderr
    # The kill came in the main evaluation that found the new best (its row is written).
    evaluated = [
        json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
    ]
    assert evaluated[-1] == 8
    best = out / "best_checkpoint"
    saved = int((best / "step.txt").read_text())
    assert saved == (4 if kill[0] == "best-new" else 8)
    # Whole, and what dynamics eval and push read: the adapter (its tensors load), its
    # config, the tokenizer, every file of the uninterrupted run's.
    assert {p.name for p in best.iterdir()} == {
        p.name for p in (base / "reference" / "best_checkpoint").iterdir()
    }
    adapter = safetensors.torch.load_file(str(best / "adapter_model.safetensors"))
    assert adapter.keys() == expected["adapter"].keys()
    assert json.loads((best / "adapter_config.json").read_text())["r"] == 4
    assert run_state.find_resume_point(out) is not None
    resume_here(out)
    assert comparable(out) == expected
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_a_run_killed_at_a_random_moment_resumes_to_the_same_files(reference):
    # The kill lands between the first resume point and the summary, timed on this
    # machine's reference run, so that it is inside the run on a fast CPU as on a slow one.
    base, expected, remaining = reference
    out = base / "killed-random"
    process, _ = _started_until_first_resume_point(base, out)
    time.sleep(random.Random(0).uniform(0.0, 0.5) * remaining)
    process.kill()
    assert process.wait() == -9
    assert not (out / "summary.json").exists()
    # A run folder can be moved (or copied) before it is resumed: its saved config names
    # where it was, which does not matter.
    moved = out.rename(base / "killed-random-moved")
    resume_here(moved)
    assert comparable(moved) == expected


def test_resuming_a_finished_run_says_so(reference, capsys):
    base, _, _ = reference
    assert cli_main(["run", "--resume", str(base / "reference")]) == 0
    assert "already finished" in capsys.readouterr().out
    # The other form, CONFIG --out DIR --resume, says the same.
    assert (
        cli_main(["run", str(base / "config.yaml"), "--out", str(base / "reference"), "--resume"])
        == 0
    )
    assert "already finished" in capsys.readouterr().out


def test_resuming_with_another_config_is_refused(reference, capsys):
    base, _, _ = reference
    # The finished reference run without its summary: a run that stopped after its last
    # resume point.
    out = shutil.copytree(base / "reference", base / "unfinished-for-config")
    (out / "summary.json").unlink()
    assert run_state.find_resume_point(out) is not None
    code = cli_main(
        ["run", str(base / "config.yaml"), "--out", str(out), "--resume", "optimizer.lr=0.5"]
    )
    error = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in error
    assert "optimizer" in error and "dynamics run --resume" in error


def test_a_torn_resume_point_is_detected_and_the_previous_one_used(tmp_path):
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    for step in (2, 4, 6):
        run_state.write_resume_point(
            run_folder, step, lambda f, s=step: (f / "loop.json").write_text(f'{{"step": {s}}}')
        )
    assert run_state.find_resume_point(run_folder) == run_folder / "last_checkpoint"
    # Two are kept: the last and the one before it (step 2's was deleted by the save of 6).
    assert sorted(p.name for p in run_folder.iterdir()) == [
        "last_checkpoint",
        "previous_checkpoint",
    ]
    assert run_state.check_resume_point(run_folder / "previous_checkpoint") == (4, None)
    # A crash between the two renames of the next save: only the renamed one is left.
    os.replace(run_folder / "last_checkpoint", tmp_path / "gone")
    assert run_state.find_resume_point(run_folder) == run_folder / "previous_checkpoint"
    # A torn file (size or content not what the manifest says) is never used.
    (run_folder / "previous_checkpoint" / "loop.json").write_text('{"step": 9}')
    choice = run_state.choose_resume_point(run_folder)
    assert choice.path is None
    assert choice.damaged == [
        (
            run_folder / "previous_checkpoint",
            "loop.json does not match its SHA-256 in manifest.json",
        )
    ]


def test_saved_training_state_loads_without_unpickling(tmp_path):
    # Everything in a resume point is JSON or safetensors: torch.load is never needed.
    from dynamics.engine.learner import RNGState, TrainingSnapshot, load_snapshot, save_snapshot

    snapshot = TrainingSnapshot(
        parameters=[torch.randn(3, 2)],
        optimizer_state=[{"step": torch.tensor(3.0), "exp_avg": torch.randn(3, 2)}],
        param_group_settings=[{"lr": 0.1, "betas": (0.9, 0.999), "foreach": None}],
        lr_scheduler={"last_epoch": 3, "base_lrs": [0.1], "lr_lambdas": [None]},
        grad_scaler=None,
        sampler={"choice_rng": {"state": {"state": 2**100, "inc": 7}}, "streams": [{"epoch": 1}]},
        rng=RNGState.capture(),
    )
    save_snapshot(snapshot, tmp_path, "learner")
    loaded = load_snapshot(tmp_path, "learner")
    assert torch.equal(loaded.parameters[0], snapshot.parameters[0])
    assert loaded.optimizer_state[0]["step"].item() == 3.0
    assert loaded.param_group_settings == snapshot.param_group_settings  # the tuple stays a tuple
    assert loaded.lr_scheduler == snapshot.lr_scheduler and loaded.sampler == snapshot.sampler
    assert torch.equal(loaded.rng.torch_cpu, snapshot.rng.torch_cpu)
    assert loaded.rng.python == snapshot.rng.python
    assert (
        loaded.rng.numpy[0] == snapshot.rng.numpy[0]
        and (loaded.rng.numpy[1] == snapshot.rng.numpy[1]).all()
    )

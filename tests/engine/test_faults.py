"""Faults beyond a kill, with real run folders: the disk filling up while a resume point or
the best checkpoint is written, a resume point damaged after it was written, and a report
read while a log's last line is still being written."""

from __future__ import annotations

import errno
import json
import logging
import shutil
from pathlib import Path

import peft.peft_model
import pytest
import safetensors
import safetensors.torch
import yaml

from dynamics.cli import main as cli_main
from dynamics.runs import state as run_state
from tests.engine.test_resume import comparable
from tests.engine.test_run import tiny_config


def faults_config(tokenizer_dir: Path, out: Path) -> dict:
    data = tiny_config(tokenizer_dir, out)
    # Resume points at steps 2, 4 and 6 of 8; main evaluations (and best checkpoints) every 2.
    data["training"]["checkpoint_interval"] = 2
    data["evaluation"]["interval"] = 2
    return data


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path, dict]:
    """The run config, one uninterrupted run folder, and what it left."""
    from tests.fixtures.tiny_tokenizer import tiny_tokenizer

    base = tmp_path_factory.mktemp("faults")
    tiny_tokenizer().save_pretrained(base / "tokenizer")
    config = base / "config.yaml"
    config.write_text(yaml.safe_dump(faults_config(base / "tokenizer", base / "unused")))
    out = base / "reference"
    assert cli_main(["run", str(config), "--out", str(out), "--no-progress"]) == 0
    files = comparable(out)
    assert files["summary"]["feasible"]  # so that a best checkpoint is written
    return config, out, files


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("dynamics run: error: ") and "\n" not in err, err
    return err


def fill_up_on(calls: list[str], n: int, error: Exception, real):
    """A save function that writes the N-th file it is asked for half-way, then fails as a
    full disk does; ``calls`` collects every path it is given."""

    def save(tensors, filename, *args, **kwargs):
        calls.append(str(filename))
        if len(calls) == n:
            real(tensors, filename, *args, **kwargs)
            size = Path(filename).stat().st_size
            with open(filename, "r+b") as handle:
                handle.truncate(size // 2)
            raise error
        return real(tensors, filename, *args, **kwargs)

    return save


def test_a_full_disk_while_a_resume_point_is_written_stops_the_run_and_keeps_the_last_one(
    reference, tmp_path, monkeypatch, capsys
):
    config, _, expected = reference
    out = tmp_path / "run"
    calls: list[str] = []
    full = OSError(errno.ENOSPC, "No space left on device")
    # save_snapshot writes learner.safetensors with it: once per resume point (no backtracking).
    monkeypatch.setattr(
        safetensors.torch, "save_file", fill_up_on(calls, 3, full, safetensors.torch.save_file)
    )
    assert cli_main(["run", str(config), "--out", str(out), "--no-progress"]) == 1
    err = one_line(capsys)
    assert len(calls) == 3 and all(
        "/.dynamics-tmp-last_checkpoint." in c for c in calls
    )  # the save of step 6
    assert "no space left on the device while writing the resume point of step 6" in err
    assert str(out / "last_checkpoint") in err
    assert f"free space there, then continue the run with dynamics run --resume {out}" in err
    assert "it goes on from last_checkpoint/ (step 4)" in err
    # The half-written folder is gone; step 4's resume point is whole. The one of step 2 was
    # deleted before the save began (a run holds at most two), and nothing else was touched.
    assert hidden(out) == []
    assert not (out / "summary.json").exists()
    assert run_state.check_resume_point(out / "last_checkpoint") == (4, None)
    assert not (out / "previous_checkpoint").exists()
    assert [
        json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
    ] == [0, 2, 4, 6]

    monkeypatch.undo()
    assert cli_main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert comparable(out) == expected
    assert json.loads((out / "summary.json").read_text())["resumed_at"] == [4]


def test_a_full_disk_while_the_best_checkpoint_is_written_keeps_the_one_before(
    reference, tmp_path, monkeypatch, capsys
):
    config, reference_folder, expected = reference
    out = tmp_path / "run"
    best_steps = [int((reference_folder / "best_checkpoint" / "step.txt").read_text())]
    assert best_steps == [expected["summary"]["best_checkpoint"]["step"]]
    calls: list[str] = []
    # What safetensors itself raises when the disk fills up (it wraps the OS error).
    full = safetensors.SafetensorError(
        'Error while serializing: I/O error: No space left on device (os error 28) at path "x"'
    )
    # PEFT saves the adapter with it: once per best checkpoint. Fail the second one.
    monkeypatch.setattr(
        peft.peft_model,
        "safe_save_file",
        fill_up_on(calls, 2, full, peft.peft_model.safe_save_file),
    )
    assert cli_main(["run", str(config), "--out", str(out), "--no-progress"]) == 1
    err = one_line(capsys)
    assert len(calls) == 2 and all("/.dynamics-tmp-best_checkpoint." in c for c in calls)
    step = int(err.split("while writing the best checkpoint of step ")[1].split(" ")[0])
    assert f"({out / 'best_checkpoint'}): free space there" in err
    assert f"dynamics run --resume {out}" in err
    # The first best checkpoint is whole, under its own name; nothing half-written is left.
    assert hidden(out) == []
    kept = safetensors.torch.load_file(str(out / "best_checkpoint" / "adapter_model.safetensors"))
    first = int((out / "best_checkpoint" / "step.txt").read_text())
    assert 0 < first < step
    assert kept.keys() == expected["adapter"].keys()

    monkeypatch.undo()
    assert cli_main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert comparable(out) == expected


def stopped_copy(reference_folder: Path, folder: Path) -> Path:
    """The reference run as it stood when killed after its last evaluation, before its
    summary: both resume points (steps 4 and 6) in place."""
    shutil.copytree(reference_folder, folder)
    (folder / "summary.json").unlink()
    assert run_state.check_resume_point(folder / "previous_checkpoint") == (4, None)
    assert run_state.check_resume_point(folder / "last_checkpoint") == (6, None)
    return folder


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("file", "damage", "why"),
    [
        (
            "learner.safetensors",
            flip_a_byte,
            "learner.safetensors does not match its SHA-256 in manifest.json",
        ),
        ("loop.json", cut_in_half, "loop.json has"),
    ],
    ids=["flipped-safetensors", "truncated-json"],
)
def test_a_damaged_resume_point_is_passed_over_for_the_one_before(
    reference, tmp_path, caplog, file, damage, why
):
    _, reference_folder, expected = reference
    out = stopped_copy(reference_folder, tmp_path / "run")
    damage(out / "last_checkpoint" / file)
    with caplog.at_level(logging.WARNING, logger="dynamics.engine.run"):
        assert cli_main(["run", "--resume", str(out), "--no-progress"]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"last_checkpoint/: {why}" in warnings[0]
    assert "resuming from previous_checkpoint/ (step 4) instead" in warnings[0]
    assert json.loads((out / "summary.json").read_text())["resumed_at"] == [4]
    assert comparable(out) == expected


def test_a_resume_keeps_a_users_hidden_folders_and_removes_only_the_runs_leftovers(
    reference, tmp_path
):
    _, reference_folder, expected = reference
    out = stopped_copy(reference_folder, tmp_path / "run")
    # The run folder is a git repository of the user's, with an editor's folder beside it.
    users = {
        ".git/HEAD": b"ref: refs/heads/main\n",
        ".git/objects/ab/cdef": b"\x78\x01blob",
        ".idea/workspace.xml": b"<x/>",
    }
    for name, data in users.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    # What the killed run left half-written: a best checkpoint's folder and a log's file.
    (out / ".dynamics-tmp-best_checkpoint.k3j2").mkdir()
    (out / ".dynamics-tmp-best_checkpoint.k3j2" / "adapter_model.safetensors").write_bytes(b"half")
    (out / ".dynamics-tmp-metrics.jsonl.p9q8.tmp").write_text('{"step": 8')
    assert cli_main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert {name: (out / name).read_bytes() for name in users} == users
    assert hidden(out) == [".git", ".idea"]
    assert comparable(out) == expected


def test_no_usable_resume_point_is_one_error_and_changes_nothing(reference, tmp_path, capsys):
    _, reference_folder, _ = reference
    out = stopped_copy(reference_folder, tmp_path / "run")
    flip_a_byte(out / "last_checkpoint" / "learner.safetensors")
    cut_in_half(out / "previous_checkpoint" / "loop.json")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert cli_main(["run", "--resume", str(out), "--no-progress"]) == 2
    err = one_line(capsys)
    assert f"{out} has no usable resume point" in err
    assert "last_checkpoint/: learner.safetensors does not match its SHA-256" in err
    assert "previous_checkpoint/: loop.json has" in err
    assert f"dynamics run {out / 'config.yaml'} --out NEW_DIR" in err
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_report_of_a_run_still_writing_skips_only_an_unfinished_last_line(
    reference, tmp_path, capsys
):
    _, reference_folder, _ = reference
    out = stopped_copy(reference_folder, tmp_path / "run")
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 2, 4, 6, 8]
    # The last row half-written: no newline after it, not valid JSON.
    metrics.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    assert cli_main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "unfinished: no summary.json yet" in printed
    assert "evaluated up to step 6 of 8 steps" in printed
    table = printed.split("feasible  weights")[1].split("\n\n")[0].strip().splitlines()
    assert [row.split()[0] for row in table] == ["0", "2", "4", "6"]
    assert (
        "note: metrics.jsonl: left out its unfinished last line (5), still being written" in printed
    )

    # A damaged line that is not the last one is an error naming the file and the line.
    metrics.write_text("\n".join([lines[0], lines[1][:10], *lines[2:]]) + "\n")
    assert cli_main(["report", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert f"{metrics}, line 2: not valid JSON" in err
    # A complete last line (it ends with its newline) that is damaged is an error too.
    controller = out / "controller.jsonl"
    updates = controller.read_text().splitlines()
    controller.write_text("\n".join([*updates[:-1], updates[-1][:-20]]) + "\n")
    metrics.write_text("\n".join(lines) + "\n")
    assert cli_main(["report", str(out)]) == 2
    assert f"controller.jsonl, line {len(updates)}: not valid JSON" in capsys.readouterr().err


def test_report_of_a_run_before_its_first_evaluation_and_of_no_run_folder(
    reference, tmp_path, capsys
):
    _, reference_folder, _ = reference
    out = tmp_path / "run"
    out.mkdir()
    shutil.copy(reference_folder / "config.yaml", out / "config.yaml")  # set up, nothing logged yet
    assert cli_main(["report", str(out)]) == 0
    assert (
        "(0 mixture updates so far, no main evaluation yet of 8 steps)" in capsys.readouterr().out
    )
    (out / "config.yaml").unlink()
    assert cli_main(["report", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        f"{out / 'summary.json'} and {out / 'config.yaml'} are missing: "
        f"is {out} a dynamics run folder?" in err
    )

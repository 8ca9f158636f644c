"""How a run writes the folders of its run folder (the best checkpoint above all) and what
a resume removes: a kill at any moment of a best checkpoint's swap leaves one whole best
checkpoint for readers, what is written is synced to disk (files, then folders, then the
parent after the rename), and a resume removes only the temporary files and folders the run
names itself, never a user's own hidden ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynamics.runs import rundir
from dynamics.runs import state as run_state

SRC = Path(rundir.__file__).resolve().parents[2]


def checkpoint_writer(step: int):
    """A ``write`` of a small best checkpoint of ``step``, shaped as a real one: files at the
    top and in a subfolder."""

    def write(folder: Path) -> None:
        (folder / "adapter_config.json").write_text(f'{{"step": {step}}}')
        (folder / "adapter_model.safetensors").write_bytes(bytes([step]) * 4096)
        (folder / "step.txt").write_text(f"{step}\n")
        (folder / "tokenizer").mkdir()
        (folder / "tokenizer" / "tokenizer.json").write_text(f'{{"step": {step}}}')

    return write


def read_checkpoint(folder: Path) -> int:
    """The step of a whole checkpoint written by :func:`checkpoint_writer` (every file says
    the same)."""
    step = int((folder / "step.txt").read_text())
    assert (folder / "adapter_config.json").read_text() == f'{{"step": {step}}}'
    assert (folder / "adapter_model.safetensors").read_bytes() == bytes([step]) * 4096
    assert (folder / "tokenizer" / "tokenizer.json").read_text() == f'{{"step": {step}}}'
    return step


def run_folder_names(run_folder: Path) -> list[str]:
    return sorted(p.name for p in run_folder.iterdir())


# --- a kill in the middle of a best checkpoint's swap ---------------------------------------

# Each: where the swap of a second best checkpoint (step 2) over the first (step 1) is cut
# by an exit without any cleanup (os._exit, as a kill), whether the file system offers an
# exchange of two folders, and the whole checkpoint readers then find (its folder, its
# step). The hook runs as the call it names is made ("before") or once it returned ("after").
# With an exchange best_checkpoint/ holds a whole checkpoint at every moment; without one, a
# kill between the two renames leaves the first whole under the name the run set it aside as.
KILLS = {
    "before-the-exchange": ("exchange", "before", True, "best_checkpoint", 1),
    "after-the-exchange": ("exchange", "after", True, "best_checkpoint", 2),
    "between-the-renames": ("rename-in", "before", False, ".dynamics-old-best_checkpoint", 1),
    "after-the-renames": ("rename-in", "after", False, "best_checkpoint", 2),
}

CHILD = """
import os, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from dynamics.runs import rundir
from tests.runs.test_folder_writes import checkpoint_writer

run_folder, call, when = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
exchanges = sys.argv[4] == "True"
best = run_folder / rundir.CHECKPOINT_DIR
rundir.atomic_write_dir(best, checkpoint_writer(1))
real_exchange, real_replace = rundir.exchange, os.replace

def exchange(new, path):
    if call == "exchange" and when == "before":
        os._exit(9)
    done = real_exchange(new, path) if exchanges else False
    if call == "exchange":
        os._exit(9)
    return done

def replace(src, dst):
    into_place = Path(dst) == best and Path(src).name.startswith(rundir.temporary_prefix(best))
    if not into_place:
        return real_replace(src, dst)
    if when == "before":
        os._exit(9)
    real_replace(src, dst)
    os._exit(9)

rundir.exchange = exchange
if call == "rename-in":
    os.replace = replace
rundir.atomic_write_dir(best, checkpoint_writer(2))
"""


@pytest.mark.parametrize("kill", list(KILLS), ids=list(KILLS))
def test_a_kill_during_the_best_checkpoints_swap_leaves_one_whole_best_checkpoint(tmp_path, kill):
    call, when, exchanges, folder, step = KILLS[kill]
    script = CHILD.format(tests=str(SRC.parent))
    child = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), call, when, str(exchanges)],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 9, child.stderr
    assert (tmp_path / "best_checkpoint").is_dir() == (folder == "best_checkpoint")
    found = rundir.best_checkpoint_dir(tmp_path)
    assert found == tmp_path / folder
    assert read_checkpoint(found) == step
    # What the swap left is all the run's own: a resume removes it, and the next swap works.
    left = [name for name in run_folder_names(tmp_path) if name != "best_checkpoint"]
    assert left and all(rundir.owned(name) for name in left)
    run_state.clear_unfinished(tmp_path, keep=None)
    rundir.atomic_write_dir(tmp_path / "best_checkpoint", checkpoint_writer(3))
    assert run_folder_names(tmp_path) == ["best_checkpoint"]
    assert read_checkpoint(tmp_path / "best_checkpoint") == 3


def test_the_swap_without_an_exchange_replaces_the_best_checkpoint_and_leaves_nothing(
    tmp_path, monkeypatch
):
    # NFS and most cluster file systems cannot exchange two folders: two renames instead.
    monkeypatch.setattr(rundir, "exchange", lambda new, path: False)
    for step in (1, 2):
        rundir.atomic_write_dir(tmp_path / "best_checkpoint", checkpoint_writer(step))
    assert run_folder_names(tmp_path) == ["best_checkpoint"]
    assert read_checkpoint(tmp_path / "best_checkpoint") == 2


def test_the_exchange_swaps_two_folders_on_this_file_system(tmp_path):
    # The tests' file system offers it (ext4, xfs, btrfs, tmpfs): the swap above relies on it.
    from dynamics.runs.exchange import exchange

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "which").write_text(name)
    assert exchange(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "a" / "which").read_text() == "b"
    assert (tmp_path / "b" / "which").read_text() == "a"


# --- synced to disk ---------------------------------------------------------------------------


def test_a_best_checkpoint_is_synced_files_then_folders_then_the_parent_after_the_swap(
    tmp_path, monkeypatch
):
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    best = run_folder / "best_checkpoint"
    rundir.atomic_write_dir(best, checkpoint_writer(1))
    events: list[tuple[str, tuple[int, int] | None]] = []
    real_fsync, real_exchange = os.fsync, rundir.exchange

    def fsync(fd: int) -> None:
        stat = os.fstat(fd)
        events.append(("fsync", (stat.st_dev, stat.st_ino)))
        real_fsync(fd)

    def exchange(new: Path, path: Path) -> bool:
        events.append(("exchange", None))
        return real_exchange(new, path)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(rundir, "exchange", exchange)
    rundir.atomic_write_dir(best, checkpoint_writer(2))
    assert read_checkpoint(best) == 2

    def first_sync(path: Path) -> int:
        stat = path.stat()
        return events.index(("fsync", (stat.st_dev, stat.st_ino)))

    swapped = events.index(("exchange", None))
    files = [p for p in best.rglob("*") if p.is_file()]
    folders = [best, best / "tokenizer"]
    assert len(files) == 4
    for path in files:  # each file before the folder that holds it
        assert first_sync(path) < first_sync(path.parent) < swapped
    assert first_sync(best / "tokenizer") < first_sync(best)
    assert all(first_sync(folder) < swapped for folder in folders)
    # The run folder's entries (the exchanged names) after the exchange.
    parent = (run_folder.stat().st_dev, run_folder.stat().st_ino)
    assert ("fsync", parent) in events[swapped:]


def test_a_resume_point_is_synced_before_it_is_swapped_in(tmp_path, monkeypatch):
    synced: list[tuple[int, int]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        stat = os.fstat(fd)
        synced.append((stat.st_dev, stat.st_ino))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)

    def write(folder: Path) -> None:
        (folder / "loop.json").write_text('{"step": 2}')
        (folder / "rng").mkdir()
        (folder / "rng" / "learner.rank1.json").write_text("{}")

    run_state.write_resume_point(tmp_path, 2, write)
    point = tmp_path / "last_checkpoint"
    for path in [*point.rglob("*"), point, tmp_path]:
        assert (path.stat().st_dev, path.stat().st_ino) in synced, path


# --- what a resume removes ----------------------------------------------------------------------


def test_clearing_before_a_resume_removes_the_runs_leftovers_and_keeps_a_users_hidden_files(
    tmp_path,
):
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    run_state.write_resume_point(
        run_folder, 2, lambda folder: (folder / "loop.json").write_text("{}")
    )
    keep = run_folder / "last_checkpoint"
    # A user's own: a git repository, an editor's folder, a hidden file.
    users = {
        ".git/HEAD": b"ref: refs/heads/main\n",
        ".git/objects/ab/cdef": b"\x00\x01blob",
        ".vscode/settings.json": b"{}",
        ".envrc": b"export X=1\n",
    }
    for name, data in users.items():
        (run_folder / name).parent.mkdir(parents=True, exist_ok=True)
        (run_folder / name).write_bytes(data)
    # What interrupted writes of the run leave: a half-written folder and file, the folder a
    # swap without an exchange set aside, one being deleted.
    leftovers = [
        ".dynamics-tmp-best_checkpoint.x1y2/adapter_model.safetensors",
        ".dynamics-tmp-metrics.jsonl.z3.tmp",
        ".dynamics-old-best_checkpoint/step.txt",
        ".dynamics-removing-previous_checkpoint/loop.json",
    ]
    for name in leftovers:
        (run_folder / name).parent.mkdir(parents=True, exist_ok=True)
        (run_folder / name).write_bytes(b"half")
    run_state.clear_unfinished(run_folder, keep=keep)
    assert {name: (run_folder / name).read_bytes() for name in users} == users
    assert run_folder_names(run_folder) == [".envrc", ".git", ".vscode", "last_checkpoint"]
    assert run_state.check_resume_point(keep) == (2, None)

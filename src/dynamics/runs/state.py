"""The resumable state in ``last_checkpoint/``: written atomically, checked when read.

A resume point holds the loop's state (``loop.json``: the history so far, the loop's
variables, the policy's state), the learner's training state (``learner.safetensors`` for
tensors, ``learner.json`` for the rest; the engine writes both), the learner state that
backtracking would return to (``feasible.*``, when there is one), and a copy of
``best_checkpoint/`` as it stood (``best/``), so that a resumed run never keeps a best
checkpoint from steps it is about to train again. ``loop.json`` records the number of
processes that saved it (``processes``); under several, ``rng/`` holds each rank's RNG
state for the learner and the feasible state (``learner.rank{r}.*``, ``feasible.rank{r}.*``),
which ``learner.*`` and ``feasible.*`` hold for rank 0 alone.

``manifest.json``, written last, lists every file with its size and SHA-256. A run folder
keeps two resume points: ``last_checkpoint/`` and the one before it,
``previous_checkpoint/``. A save first deletes ``previous_checkpoint/``, fills a fresh
temporary folder and syncs it to disk (:func:`dynamics.runs.rundir.atomic_write_dir`),
then renames ``last_checkpoint/`` to ``previous_checkpoint/`` and the new folder to
``last_checkpoint/``; so at every moment one complete resume point exists, and a save
that fails (a kill, a full disk) leaves the last one as it was.
:func:`choose_resume_point` uses the newest folder whose files match its manifest, and
names the ones that do not (a file truncated or changed after it was written). Only JSON
and safetensors are read back: nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamics.runs.rundir import (
    CHECKPOINT_DIR,
    CONTROLLER_FILE,
    METRICS_FILE,
    OWNED_PREFIX,
    RunDirError,
    atomic_write_dir,
    owned,
    replaced_name,
)

RESUME_DIR = "last_checkpoint"
PREVIOUS_DIR = "previous_checkpoint"
MANIFEST_FILE = "manifest.json"
LOOP_FILE = "loop.json"
BEST_COPY = "best"
RNG_DIR = "rng"


def rank_rng_name(state: str, rank: int) -> str:
    """The name of rank ``rank``'s RNG files in ``rng/`` for ``state`` ("learner" or "feasible")."""
    return f"{state}.rank{rank}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _previous(name: str) -> str | None:
    # A run folder keeps the resume point before the last; a Trainer checkpoint's mixture
    # state (another ``name``) is one folder: the Trainer keeps its own older checkpoints.
    return PREVIOUS_DIR if name == RESUME_DIR else None


def _remove(folder: Path) -> None:
    """Delete ``folder``, first renamed to a temporary name of the run's, so that a kill in
    the middle never leaves a half-deleted folder under its own name (and a resume removes
    what is left)."""
    if folder.exists():
        trash = folder.with_name(f"{OWNED_PREFIX}removing-{folder.name}")
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)


def _remove_left(path: Path) -> None:
    """Delete a temporary file or folder an interrupted write left."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def write_resume_point(
    run_folder: Path, step: int, write: Callable[[Path], None], name: str = RESUME_DIR
) -> None:
    """Fill a fresh folder with ``write``, add the manifest, and swap it in as ``name``
    (``last_checkpoint/``); the resume point it replaces becomes ``previous_checkpoint/``
    (whose own older one is deleted first, to free its space). If ``write`` fails, the
    fresh folder is removed and ``name`` is left as it was."""

    def fill(folder: Path) -> None:
        write(folder)
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        manifest = {
            "step": step,
            "files": {
                str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                for p in files
            },
        }
        (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")

    previous = _previous(name)
    if previous is not None and (run_folder / name).is_dir():
        _remove(run_folder / previous)
    atomic_write_dir(
        run_folder / name, fill, keep_previous=None if previous is None else run_folder / previous
    )


def check_resume_point(folder: Path) -> tuple[int | None, str | None]:
    """``(step, None)`` for a resume point whose files all match its manifest, else
    ``(None, what does not match)``."""
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
        files = manifest["files"]
        step = int(manifest["step"])
    except OSError:
        return None, f"{MANIFEST_FILE} is missing"
    except (ValueError, KeyError, TypeError):
        return None, f"{MANIFEST_FILE} cannot be read"
    try:
        for name, expected in files.items():
            path = folder / name
            if not path.is_file():
                return None, f"{name} is missing"
            size = path.stat().st_size
            if size != expected["bytes"]:
                return None, f"{name} has {size} bytes where its manifest says {expected['bytes']}"
            if _sha256(path) != expected["sha256"]:
                return None, f"{name} does not match its SHA-256 in {MANIFEST_FILE}"
    except (OSError, KeyError, TypeError) as err:
        return None, f"its files cannot be checked ({err})"
    return step, None


@dataclass(frozen=True)
class ResumeChoice:
    """The resume point a resume uses (``path`` None when there is none) and the folders
    that were passed over because their files do not match their manifest."""

    path: Path | None
    step: int | None
    damaged: list[tuple[Path, str]] = field(default_factory=list)

    def describe_damaged(self) -> str:
        return "; ".join(f"{folder.name}/: {why}" for folder, why in self.damaged)


def choose_resume_point(run_folder: Path, name: str = RESUME_DIR) -> ResumeChoice:
    """The newest complete resume point ``name`` of ``run_folder`` (or the one before it),
    and the damaged ones passed over."""
    previous = _previous(name)
    candidates = [
        run_folder / name,
        *([run_folder / previous] if previous else []),
        replaced_name(run_folder / name),
    ]
    good: list[tuple[int, Path]] = []
    damaged: list[tuple[Path, str]] = []
    for folder in candidates:
        if not folder.is_dir():
            continue
        step, problem = check_resume_point(folder)
        if step is None:
            damaged.append((folder, problem or "damaged"))
        else:
            good.append((step, folder))
    if not good:
        return ResumeChoice(None, None, damaged)
    step, folder = max(good, key=lambda item: item[0])
    return ResumeChoice(folder, step, damaged)


def find_resume_point(run_folder: Path, name: str = RESUME_DIR) -> Path | None:
    """The newest complete resume point ``name`` of ``run_folder`` (None when there is none)."""
    return choose_resume_point(run_folder, name).path


def clear_unfinished(run_folder: Path, keep: Path | None, damaged: Iterable[Path] = ()) -> None:
    """Before a resume: remove what an interrupted session left half-made (the temporary
    files and folders of a save or a best checkpoint: only names the run gives them,
    :func:`dynamics.runs.rundir.owned`, so a user's own hidden files and folders stay), the
    ``damaged`` resume points, and every resume point newer than ``keep``. With no resume
    point to keep, the logs and best checkpoint go too: the run starts over."""
    remove = {Path(p).resolve() for p in damaged}
    for path in run_folder.iterdir():
        if keep is not None and path.resolve() == keep.resolve():
            continue
        if owned(path.name):
            _remove_left(path)
        elif path.resolve() in remove or (
            path.name == RESUME_DIR and (keep is None or keep.name != RESUME_DIR)
        ):
            shutil.rmtree(path)
        elif path.name == PREVIOUS_DIR and keep is None:
            shutil.rmtree(path)
    if keep is None:
        for name in (METRICS_FILE, CONTROLLER_FILE):
            (run_folder / name).unlink(missing_ok=True)
        shutil.rmtree(run_folder / CHECKPOINT_DIR, ignore_errors=True)


def save_best_copy(run_folder: Path, folder: Path) -> None:
    """Keep ``best_checkpoint/`` as it stands now inside the resume point (hard links where
    the file system allows: the best checkpoint is replaced by a swap, never rewritten)."""
    best = run_folder / CHECKPOINT_DIR
    if not best.is_dir():
        return

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(best, folder / BEST_COPY, copy_function=link_or_copy)


def restore_best_copy(run_folder: Path, resume_point: Path) -> None:
    """Put the resume point's best checkpoint back (or remove a later one)."""
    saved = resume_point / BEST_COPY
    best = run_folder / CHECKPOINT_DIR
    if saved.is_dir():

        def write(folder: Path) -> None:
            shutil.copytree(saved, folder, dirs_exist_ok=True)

        atomic_write_dir(best, write)
    elif best.exists():
        _remove(best)


def read_loop_file(resume_point: Path) -> dict[str, Any]:
    """``loop.json`` of a resume point: the controller's state (``"loop"``, what
    ``MixtureController.load_state_dict`` reads) and the driver's own entries (training
    time, resume steps)."""
    try:
        data: dict[str, Any] = json.loads((resume_point / LOOP_FILE).read_text())
    except (OSError, ValueError) as err:
        raise RunDirError(
            f"{resume_point / LOOP_FILE} cannot be read ({err}): the resume point is damaged"
        ) from None
    return data


def saved_processes(resume_point: Path) -> int | None:
    """The number of processes that saved ``resume_point`` (None when its loop file does
    not say)."""
    processes = read_loop_file(resume_point).get("processes")
    return None if processes is None else int(processes)

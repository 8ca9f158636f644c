"""The run folder: the contract between training and reporting (docs/method.md, "The run folder").

A run writes ``config.yaml`` (resolved), ``metrics.jsonl`` (one line per main evaluation),
``controller.jsonl`` (one line per mixture update), ``summary.json`` and, when a feasible
checkpoint exists, ``best_checkpoint/`` (PEFT adapter or full weights, safetensors).
Every file is written atomically (write to a temporary file, then rename), so a crash
or a full disk never leaves a half-written file and a reader never sees one. Every
temporary name the run gives a file or folder starts with :data:`OWNED_PREFIX`, so that a
resume removes what an interrupted write left and nothing else (a user's ``.git/``, say).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import yaml

from dynamics.core.metrics import EvalPoint
from dynamics.core.records import CheckpointRecord, EvaluationLine, UpdateRecord
from dynamics.runs.exchange import exchange

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CONTROLLER_FILE = "controller.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "best_checkpoint"
LM_EVAL_FILE = (
    "lm_eval.json"  # written by dynamics eval (dynamics.engine.harness), read by the model card
)
# The start of every name the run gives a temporary file or folder in its run folder.
OWNED_PREFIX = ".dynamics-"

logger = logging.getLogger(__name__)

Line = TypeVar("Line", EvaluationLine, UpdateRecord)


class RunDirError(ValueError):
    """A run folder that cannot be written or read; the message says what to do."""


class RunStopped(RuntimeError):
    """A run stopped by its machine, not by bad input (e.g. no space left to write its
    files): the message says what failed and how to continue; the run folder keeps its last
    complete resume point."""


_FULL = (errno.ENOSPC, errno.EDQUOT)


def out_of_space(error: BaseException) -> bool:
    """Whether ``error`` says the disk (or the quota) is full: an ``OSError`` with ENOSPC or
    EDQUOT, or a library's wrapper of one (safetensors reports "No space left on device (os
    error 28)" in a ``SafetensorError``)."""
    if isinstance(error, OSError) and error.errno in _FULL:
        return True
    text = str(error)
    return any(os.strerror(code) in text or f"os error {code})" in text for code in _FULL)


def owned(name: str) -> bool:
    """Whether ``name`` is one the run gives its temporary files and folders."""
    return name.startswith(OWNED_PREFIX)


def temporary_prefix(path: Path) -> str:
    """The start of the name of a temporary file or folder that becomes ``path``."""
    return f"{OWNED_PREFIX}tmp-{path.name}."


def replaced_name(path: Path) -> Path:
    """Where a folder that is replaced without an exchange waits until its successor is in
    place (see :func:`swap_in`)."""
    return path.with_name(f"{OWNED_PREFIX}old-{path.name}")


def fsync_file(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: Path) -> None:
    """Make the entries of the folder ``path`` (the names of what it holds) durable."""
    if os.name == "nt":
        return  # a folder cannot be opened there; its entries are written with it
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (
            errno.EINVAL,
            errno.ENOTSUP,
        ):  # a file system that cannot sync a folder
            raise
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Make ``folder`` durable: every file's bytes, then every folder's entries, the deepest
    first and ``folder`` itself last (its own entry in its parent is the caller's, after
    the rename that puts it in place)."""
    entries = sorted(folder.rglob("*"))
    for path in entries:
        if path.is_file() and not path.is_symlink():
            fsync_file(path)
    for path in sorted(
        (p for p in entries if p.is_dir() and not p.is_symlink()), key=lambda p: -len(p.parts)
    ):
        fsync_dir(path)
    fsync_dir(folder)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_dir(
    path: Path, write: Callable[[Path], None], keep_previous: Path | None = None
) -> None:
    """Fill a fresh temporary folder with ``write``, make it durable (:func:`fsync_tree`),
    then put it in place of ``path`` and sync the parent's entries after the rename. If
    ``write`` fails (a full disk, say) the temporary folder is removed and ``path`` stays as
    it was.

    The folder it replaces is deleted (:func:`swap_in`: ``path`` names one whole folder at
    every moment where the file system can exchange two folders), or with ``keep_previous``
    renamed to that path (which must not exist): a resume point's swap, where a kill
    between the two renames leaves the previous one whole under ``keep_previous``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=temporary_prefix(path)))
    try:
        write(tmp)
        fsync_tree(tmp)
        if keep_previous is None:
            swap_in(tmp, path)
        else:
            if path.exists():
                shutil.rmtree(keep_previous, ignore_errors=True)
                os.replace(path, keep_previous)
            os.replace(tmp, path)
            fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def swap_in(new: Path, path: Path) -> None:
    """Put the complete folder ``new`` in place of the folder ``path`` and delete the one it
    replaces; the parent's entries are synced once the new folder is in place, before the
    old one is deleted. With an exchange (:mod:`dynamics.runs.exchange`) ``path`` names a
    whole folder at every moment: the old one until the exchange, the new one after, and the
    old one, then under ``new``'s temporary name, is deleted last. Where the file system has
    no exchange, the old folder is renamed to :func:`replaced_name` first, and a kill before
    the second rename leaves it whole there (readers look for it:
    :func:`best_checkpoint_dir`)."""
    if not path.exists():
        os.replace(new, path)
        fsync_dir(path.parent)
    elif exchange(new, path):
        fsync_dir(path.parent)
        shutil.rmtree(new)
    else:
        old = replaced_name(path)
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(new, path)
        fsync_dir(path.parent)
        shutil.rmtree(old, ignore_errors=True)


def best_checkpoint_dir(run_folder: Path) -> Path:
    """The folder to read a run's best checkpoint from: ``best_checkpoint/``, or, where a
    swap without an exchange was cut between its two renames, the whole previous one it
    left (:func:`swap_in`); ``best_checkpoint/`` (absent) when the run has none."""
    best = run_folder / CHECKPOINT_DIR
    left = replaced_name(best)
    return left if not best.is_dir() and left.is_dir() else best


def check_run_dir(path: str | Path, allow: Iterable[str | Path] = ()) -> Path:
    """Refuse a folder that already holds something, so no earlier run is ever overwritten.
    Entries in ``allow`` (e.g. a Trainer's own output folder placed inside) do not count."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"output folder {out} is a file: choose another output_dir (or --out)")
    allowed = {Path(p).resolve() for p in allow}
    if out.is_dir() and any(entry.resolve() not in allowed for entry in out.iterdir()):
        raise RunDirError(
            f"output folder {out} is not empty: choose a new output_dir (or --out), or move the "
            f"old run away"
        )
    return out


def prepare_run_dir(path: str | Path) -> Path:
    """Create the run folder after :func:`check_run_dir`'s checks."""
    out = check_run_dir(path)
    out.mkdir(parents=True, exist_ok=True)
    return out


class JsonlLog:
    """An append-only list of JSON lines, rewritten atomically on every append (the files
    hold one line per evaluation or update: small, so rewriting is cheap and safe)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[str] = []

    def append(self, row: dict[str, Any]) -> None:
        self.lines.append(json.dumps(row, allow_nan=False))
        atomic_write_text(self.path, "\n".join(self.lines) + "\n")

    def rewrite(self, rows: Iterable[dict[str, Any]]) -> None:
        """Replace every line (earlier rows may gain fields, e.g. realized losses)."""
        self.lines = [json.dumps(row, allow_nan=False) for row in rows]
        atomic_write_text(self.path, "\n".join(self.lines) + "\n")


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, allow_nan=False) + "\n")


@dataclass(frozen=True)
class JsonlRows:
    """The rows of a JSON-lines file, and whether an unfinished last line was left out."""

    rows: list[dict[str, Any]]
    unfinished_last_line: int | None = None  # its 1-based number, when it was left out


def read_jsonl_rows(path: Path) -> JsonlRows:
    """Every row of ``path``. A last line without its newline that is not valid JSON is the
    one a writer is still writing (or was writing when it stopped): it is left out. Any
    other line that is not valid JSON is an error naming the file and the line."""
    if not path.is_file():
        raise RunDirError(f"{path} is missing: is {path.parent} a dynamics run folder?")
    text = path.read_text()
    lines = text.split("\n")
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as err:
            if number == len(lines):  # the last line, and no newline after it
                return JsonlRows(rows, unfinished_last_line=number)
            raise RunDirError(
                f"{path}, line {number}: not valid JSON ({err}); the file is damaged: "
                "restore it from a copy, or remove that line"
            ) from None
    return JsonlRows(rows)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of ``path`` (see :func:`read_jsonl_rows`; an unfinished last line is logged)."""
    read = read_jsonl_rows(path)
    if read.unfinished_last_line is not None:
        logger.warning("%s: left out line %d, still being written", path, read.unfinished_last_line)
    return read.rows


@dataclass(frozen=True)
class RunRecords:
    """A run folder read back into the records it was written from
    (:mod:`dynamics.core.records`), for metrics, reports and sweeps.

    An unfinished run (``finished`` False: still training, or stopped before its summary
    was written) has a ``summary`` holding only what its config says (method, datasets,
    domains, targets, constraints, total steps) and its number of updates so far."""

    path: Path
    summary: dict[str, Any]
    evaluations: list[EvaluationLine]
    updates: list[UpdateRecord]
    finished: bool = True
    notes: tuple[str, ...] = field(default=())  # e.g. an unfinished last line left out

    @property
    def domain_names(self) -> list[str]:
        return list(self.summary["domain_names"])

    @property
    def dataset_names(self) -> list[str]:
        return list(self.summary["dataset_names"])

    @property
    def targets(self) -> list[int]:
        return list(self.summary["targets"])

    @property
    def constraints(self) -> list[int]:
        return list(self.summary["constraints"])

    @property
    def selection_margin(self) -> float:
        """The run's checkpoint selection margin (``evaluation.selection_margin``; 0 in runs
        written before it was recorded)."""
        return float(self.summary.get("selection_margin", 0.0))

    @property
    def best_checkpoint(self) -> CheckpointRecord | None:
        """The best feasible checkpoint the summary names (None without one, or before the
        run finished)."""
        best = self.summary.get("best_checkpoint")
        return None if best is None else CheckpointRecord.from_dict(best)

    @property
    def kept_evaluations(self) -> list[EvaluationLine]:
        """The main evaluations of the states the run kept (not those a backtrack left)."""
        return [line for line in self.evaluations if not line.backtracked]

    @property
    def kept_updates(self) -> list[UpdateRecord]:
        """The updates whose mixture the run kept (not those a backtrack abandoned)."""
        return [update for update in self.updates if not update.abandoned]

    def eval_points(self) -> list[EvalPoint]:
        """The main evaluations of the states the run kept, as the core metrics'
        ``EvalPoint`` (lower-is-better values, and the eval split's per-batch values where
        the run recorded them)."""
        names = self.domain_names
        return [
            EvalPoint(
                step=line.step,
                eval=np.array([line.eval[n] for n in names], dtype=float),
                test=np.array([line.test[n] for n in names], dtype=float),
                eval_batches=None
                if line.eval_batches is None
                else np.array([line.eval_batches[n] for n in names], dtype=float),
            )
            for line in self.kept_evaluations
        ]


def _config_summary(folder: Path, num_updates: int) -> dict[str, Any]:
    """What an unfinished run's summary can say: read from its resolved ``config.yaml``."""
    path = folder / CONFIG_FILE
    try:
        config = yaml.safe_load(path.read_text())
        datasets = config["datasets"]
        targets = [d for d in datasets if d["role"] == "target"]
        domains = targets + [d for d in datasets if d["role"] == "constraint"]
        return {
            "method": config["method"]["name"],
            "dataset_names": [d["name"] for d in datasets if d["role"] != "constraint"],
            "domain_names": [d["name"] for d in domains],
            "domain_metrics": [d.get("metric", "loss") for d in domains],
            "targets": list(range(len(targets))),
            "constraints": list(range(len(targets), len(domains))),
            "total_steps": int(config["training"]["total_steps"]),
            "num_updates": num_updates,
            "selection_margin": float(config.get("evaluation", {}).get("selection_margin", 0.0)),
        }
    except (yaml.YAMLError, KeyError, TypeError, ValueError) as err:
        raise RunDirError(
            f"{path} cannot be read as a run config ({err!r}): the run folder is damaged"
        ) from None


def read_run(path: str | Path, unfinished: bool = False) -> RunRecords:
    """Read a run folder written by ``dynamics run``. With ``unfinished``, a run without its
    ``summary.json`` (still training, or stopped) is read too, from its config and logs."""
    folder = Path(path)
    summary_path = folder / SUMMARY_FILE
    finished = summary_path.is_file()
    if not finished and not unfinished:
        raise RunDirError(f"{summary_path} is missing: is {folder} a finished dynamics run folder?")
    if not finished and not (folder / CONFIG_FILE).is_file():
        raise RunDirError(
            f"{summary_path} and {folder / CONFIG_FILE} are missing: is {folder} a dynamics run "
            f"folder?"
        )
    logs = {}
    for name in (METRICS_FILE, CONTROLLER_FILE):
        if not finished and not (folder / name).is_file():
            logs[name] = JsonlRows([])  # not written yet: the run has not got that far
        else:
            logs[name] = read_jsonl_rows(folder / name)
    notes = tuple(
        f"{name}: left out its unfinished last line ({read.unfinished_last_line}), still being "
        f"written"
        for name, read in logs.items()
        if read.unfinished_last_line is not None
    )
    updates = [
        _read_line(UpdateRecord.from_dict, row, folder / CONTROLLER_FILE, number)
        for number, row in enumerate(logs[CONTROLLER_FILE].rows, start=1)
    ]
    return RunRecords(
        path=folder,
        summary=json.loads(summary_path.read_text())
        if finished
        else _config_summary(folder, len(updates)),
        evaluations=[
            _read_line(EvaluationLine.from_dict, row, folder / METRICS_FILE, number)
            for number, row in enumerate(logs[METRICS_FILE].rows, start=1)
        ],
        updates=updates,
        finished=finished,
        notes=notes,
    )


def _read_line(
    read: Callable[[dict[str, Any]], Line], row: dict[str, Any], path: Path, n: int
) -> Line:
    """The record of line ``n`` of ``path``; a line that is not one is an error naming it."""
    try:
        return read(row)
    except (KeyError, TypeError, ValueError) as err:
        why = f"it has no {err.args[0]!r}" if isinstance(err, KeyError) else str(err)
        raise RunDirError(
            f"{path}, line {n}: not a record this version of dynamics reads ({why}): "
            "read the run with the version that wrote it"
        ) from None


def named(values: Iterable[float], names: Iterable[str]) -> dict[str, float]:
    return {n: float(v) for n, v in zip(names, values, strict=True)}

"""The run folder: the contract between training and reporting (docs/method.md, "The run folder").

A run writes ``config.yaml`` (resolved), ``metrics.jsonl`` (one line per main evaluation),
``controller.jsonl`` (one line per mixture update), ``summary.json`` and, when a feasible
checkpoint exists, ``best_checkpoint/`` (PEFT adapter or full weights, safetensors).
Every file is written atomically (write to a temporary file, then rename), so a crash
never leaves a half-written file and a reader never sees one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dynamics.core.metrics import EvalPoint

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CONTROLLER_FILE = "controller.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "best_checkpoint"


class RunDirError(ValueError):
    """A run folder that cannot be written or read; the message says what to do."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_dir(path: Path, write: Callable[[Path], None]) -> None:
    """Fill a fresh temporary folder with ``write`` then swap it in place of ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        write(tmp)
        old = path.with_name(f".{path.name}.old")
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_run_dir(path: str | Path, allow: Iterable[str | Path] = ()) -> Path:
    """Refuse a folder that already holds something, so no earlier run is ever overwritten.
    Entries in ``allow`` (e.g. a Trainer's own output folder placed inside) do not count."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"output folder {out} is a file: choose another output_dir (or --out)")
    allowed = {Path(p).resolve() for p in allow}
    if out.is_dir() and any(entry.resolve() not in allowed for entry in out.iterdir()):
        raise RunDirError(
            f"output folder {out} is not empty: choose a new output_dir (or --out), or move the old run away"
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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise RunDirError(f"{path} is missing: is {path.parent} a finished dynamics run folder?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class RunRecords:
    """A run folder read back as plain data, for metrics, reports and sweeps."""

    path: Path
    summary: dict[str, Any]
    evaluations: list[dict[str, Any]]
    updates: list[dict[str, Any]]

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

    def eval_points(self) -> list[EvalPoint]:
        """The main evaluations of the states the run kept (not those a backtrack left), as
        the core metrics' ``EvalPoint`` (lower-is-better values)."""
        names = self.domain_names
        return [
            EvalPoint(
                step=int(row["step"]),
                eval=np.array([row["eval"][n] for n in names], dtype=float),
                test=np.array([row["test"][n] for n in names], dtype=float),
            )
            for row in self.evaluations
            if not row.get("backtracked", False)
        ]


def read_run(path: str | Path) -> RunRecords:
    """Read a run folder written by ``dynamics run``."""
    folder = Path(path)
    summary_path = folder / SUMMARY_FILE
    if not summary_path.is_file():
        raise RunDirError(f"{summary_path} is missing: is {folder} a finished dynamics run folder?")
    return RunRecords(
        path=folder,
        summary=json.loads(summary_path.read_text()),
        evaluations=read_jsonl(folder / METRICS_FILE),
        updates=read_jsonl(folder / CONTROLLER_FILE),
    )


def named(values: Iterable[float], names: Iterable[str]) -> dict[str, float]:
    return {n: float(v) for n, v in zip(names, values, strict=True)}

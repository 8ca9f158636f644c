"""Matplotlib without a display, PNG files written atomically, and the figure parts that
several reports draw (the mixture weights over steps)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from dynamics.runs.rundir import RunRecords

DASHES = ("-", "--", ":", "-.")
"""Line styles of the weight plots, one per dataset in turn."""


def pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, folder: Path, name: str) -> str:
    """Save ``fig`` as ``folder/name`` (PNG, via a temporary file and a rename), close it and
    return ``name``. The figure is closed and the temporary file removed even when saving
    fails."""
    tmp = folder / f".{name}.tmp.png"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(tmp, dpi=110)
        tmp.replace(folder / name)
    finally:
        tmp.unlink(missing_ok=True)
        pyplot().close(fig)
    return name


def plot_weights(ax: Any, records: RunRecords) -> None:
    """Draw a run's mixture weights over its steps on ``ax``: piecewise constant between
    updates, one line per fine-tuning dataset, labelled with its name. Dashes tell apart
    datasets that share a weight (their lines would coincide)."""
    steps = [u.step for u in records.updates] + [int(records.summary["total_steps"])]
    weights = np.array([u.weights for u in records.updates], dtype=float)
    for j, name in enumerate(records.dataset_names):
        ax.step(
            steps,
            [*weights[:, j], weights[-1, j]],
            where="post",
            label=name,
            linestyle=DASHES[j % len(DASHES)],
        )
    ax.set_ylim(-0.02, 1.02)

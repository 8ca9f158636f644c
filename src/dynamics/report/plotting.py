"""Matplotlib without a display, and PNG files written atomically."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

DASHES = ("-", "--", ":", "-.")
"""Line styles of the weight plots, one per dataset in turn."""


def pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, folder: Path, name: str) -> str:
    """Save ``fig`` as ``folder/name`` (PNG, via a temporary file and a rename), close it and
    return ``name``."""
    folder.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    tmp = folder / f".{name}.tmp.png"
    fig.savefig(tmp, dpi=110)
    tmp.replace(folder / name)
    pyplot().close(fig)
    return name

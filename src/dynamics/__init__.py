"""dynamics: fine-tune language models on a dynamic data mixture under performance constraints.

The method is DynaMiCS (docs/method.md): short rolled-back probing runs measure how each
fine-tuning dataset moves every evaluation loss, a linear (or fitted-curve) predictor extrapolates
the next stretch of training, and a small simplex problem picks the mixture that improves the
targets while keeping every constrained domain at or below the base model's level.

What a script needs is importable from here (loaded on first use, so ``import dynamics``
stays cheap):

- ``RunConfig``: a run's settings (``RunConfig.from_yaml(path)`` / ``from_dict``);
- ``run(config)``: train it in dynamics' own loop and write the run folder;
- ``DynamicsCallback``: the same method inside a transformers ``Trainer`` (or TRL's);
- ``MixtureTrainSource``: the re-weightable training data the callback hands the Trainer;
- ``DatasetConfig``: one dataset of a run, with its role (target, non-target, constraint).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "RunConfig": "dynamics.engine.config",
    "DatasetConfig": "dynamics.engine.config",
    "run": "dynamics.engine.run",
    "DynamicsCallback": "dynamics.integrations.trainer",
    "MixtureTrainSource": "dynamics.integrations.trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dynamics' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])

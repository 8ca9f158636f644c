"""What a run shows the experiment trackers (TensorBoard, Weights & Biases, MLflow), which
accelerate drives.

Public API:

- ``TRACKER_MODULES``: tracker name (``trackers`` in a run config) -> the package it needs;
  ``trackers_missing(names)``: the requested ones that are not installed.
- ``start_trackers(accelerator, config)``: ``accelerator.init_trackers`` under the config's
  ``tracker_project``, naming the run ``tracker_run_name`` (by default the run folder's name).
- ``evaluation_values(row)``: a main evaluation as flat scalars, from its ``metrics.jsonl``
  row: ``eval/<domain>``, ``test/<domain>``, ``weight/<dataset>``, ``slack/<constraint>``,
  ``worst_slack``, ``feasible``, ``target_loss_sum``, ``evaluation_seconds``.
- ``update_values(update, dataset_names)``: a mixture update: ``weight/<dataset>``,
  ``probe_seconds`` and ``probe_seconds/<dataset>``.
- ``training_values(loss, learning_rate)``: ``train/loss`` and ``train/lr``.

The same names reach a Trainer's own log (with a ``dynamics/`` prefix) through
``dynamics.integrations.DynamicsCallback``.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynamics.core.records import EvaluationLine, UpdateRecord

if TYPE_CHECKING:
    from accelerate import Accelerator

    from dynamics.engine.config import RunConfig

TRACKER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def trackers_missing(names: Sequence[str]) -> list[str]:
    """The requested trackers whose packages are not installed."""
    return [n for n in names if importlib.util.find_spec(TRACKER_MODULES[n]) is None]


def tracker_run_name(config: RunConfig) -> str:
    return config.tracker_run_name or Path(config.output_dir).name


def start_trackers(accelerator: Accelerator, config: RunConfig) -> None:
    """Start the config's trackers: TensorBoard writes under
    ``<output_dir>/<tracker_project>``; W&B and MLflow name the run."""
    name = tracker_run_name(config)
    init_kwargs = {"wandb": {"name": name}, "mlflow": {"run_name": name}}
    accelerator.init_trackers(
        config.tracker_project,
        config=flat_config(config.model_dump(mode="json")),
        init_kwargs={k: v for k, v in init_kwargs.items() if k in config.trackers},
    )


def flat_config(tree: Mapping[str, Any], prefix: str = "") -> dict[str, int | float | str | bool]:
    """A nested config as ``section.field`` keys with scalar values (TensorBoard's
    hyper-parameters take nothing else): lists, tables and null become their JSON text."""
    flat: dict[str, int | float | str | bool] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_config(value, f"{name}."))
        elif isinstance(value, int | float | str | bool):
            flat[name] = value
        else:
            flat[name] = json.dumps(value)
    return flat


def evaluation_values(row: EvaluationLine) -> dict[str, float]:
    """The scalars of one ``metrics.jsonl`` line (see the module doc for the names)."""
    values: dict[str, float] = {}
    for named, prefix in (
        (row.eval, "eval"),
        (row.test, "test"),
        (row.weights, "weight"),
        (row.constraint_slack, "slack"),
    ):
        values.update({f"{prefix}/{name}": float(v) for name, v in named.items()})
    if row.constraint_slack:
        values["worst_slack"] = min(float(v) for v in row.constraint_slack.values())
    values["feasible"] = float(row.feasible)
    values["target_loss_sum"] = float(row.target_loss_sum)
    values["evaluation_seconds"] = float(row.wall_seconds)
    return values


def update_values(update: UpdateRecord, dataset_names: Sequence[str]) -> dict[str, float]:
    """The new weights of one mixture update and what its probes took."""
    values = {
        f"weight/{name}": float(w) for name, w in zip(dataset_names, update.weights, strict=True)
    }
    values["probe_seconds"] = float(update.probe_seconds)
    if update.dataset_probe_seconds is not None:
        values.update(
            {
                f"probe_seconds/{name}": float(s)
                for name, s in zip(dataset_names, update.dataset_probe_seconds, strict=True)
            }
        )
    return values


def training_values(loss: float, learning_rate: float) -> dict[str, float]:
    """The main run's latest training loss and learning rate."""
    return {"train/loss": float(loss), "train/lr": float(learning_rate)}

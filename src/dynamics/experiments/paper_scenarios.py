"""The paper's scenarios as run configs: ``dynamics run --scenario paper/s28``.

Public API:

- ``scenario_config(name, overrides=(), data_root=None) -> RunConfig``: scenario ``name``
  (``paper/s1`` .. ``paper/s54``) with the paper's settings, ``key=value`` overrides
  applied (any field: method, schedule, predictor, model, ...), validated.
- ``scenario_config_dict(name, data_root=None) -> dict``: the same before overrides.
- ``PAPER_LEARNING_RATES``: the learning rate the paper chose per model.

The paper's settings (section 4 "Experimental Setup" and its hyper-parameter appendix):
Qwen2.5-3B with LoRA rank 32, Adam, 2,048 steps of batch 8 at sequence length 512, no
warmup, a main evaluation every 64 steps on 200 batches per domain and probes evaluated on
50, DynaMiCS with the dense-warmup schedule. The learning rate follows the model
(``PAPER_LEARNING_RATES``) unless ``optimizer.lr`` is overridden; a model the paper did not
use keeps 1e-4, with a warning. ``method.name=fixed`` without weights trains on the uniform
mixture over the fine-tuning datasets.

Datasets are read as ``dynamics.data.paper_datasets`` says, from the hub or, with
``data_root``, from local files named by abbreviation.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from dynamics.data.paper_datasets import dataset_entry
from dynamics.data.scenarios import load_scenario
from dynamics.engine.config import ConfigError, RunConfig, apply_overrides

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "Qwen/Qwen2.5-3B"
PAPER_LEARNING_RATES: dict[str, float] = {
    "Qwen/Qwen2.5-3B": 1e-4,
    "Qwen/Qwen3-8B": 5e-5,
    "Qwen/Qwen3-8B-Base": 5e-5,
    "google/gemma-3-12b-pt": 5e-5,
    "google/gemma-3-12b-it": 5e-5,
}
"""Paper section 4 "Models and training": 1e-4 for Qwen2.5-3B (every LoRA rank), 5e-5 for
Qwen3-8B and Gemma3-12B, each the best of a six-value sweep."""
FALLBACK_LEARNING_RATE = 1e-4


def scenario_config_dict(name: str, data_root: str | Path | None = None) -> dict[str, Any]:
    """The run config of scenario ``name`` as a plain dict, before overrides."""
    scenario = load_scenario(name)
    datasets = [
        dataset_entry(d.abbrev, role="target", budget=d.budget, data_root=data_root)
        for d in scenario.targets
    ]
    datasets += [
        dataset_entry(d.abbrev, role="non-target", budget=d.budget, data_root=data_root)
        for d in scenario.non_targets
    ]
    datasets += [
        dataset_entry(c.abbrev, role="constraint", metric=c.metric, data_root=data_root)
        for c in scenario.constraints
    ]
    return {
        "model": {"name_or_path": DEFAULT_MODEL},
        "lora": {"rank": 32},
        "optimizer": {
            "lr": PAPER_LEARNING_RATES[DEFAULT_MODEL],
            "lr_schedule": "constant",
            "warmup_steps": 0,
        },
        "training": {"total_steps": 2048, "batch_size": 8, "sequence_length": 512},
        "evaluation": {"interval": 64, "batches": 200, "reduced_batches": 50},
        "method": {"name": "dynamics", "schedule": "dense-warmup"},
        "datasets": datasets,
        "output_dir": f"runs/{name.replace('/', '-')}",
    }


def scenario_config(
    name: str, overrides: list[str] | tuple[str, ...] = (), data_root: str | Path | None = None
) -> RunConfig:
    """Scenario ``name`` with the paper's settings and ``key=value`` overrides, validated."""
    data = apply_overrides(scenario_config_dict(name, data_root), list(overrides))
    keys = {item.split("=", 1)[0].strip() for item in overrides}
    if "optimizer.lr" not in keys and "optimizer" not in keys:
        model = (data.get("model") or {}).get("name_or_path")
        if model is not None and model not in PAPER_LEARNING_RATES:
            logger.warning(
                "%s is not one of the paper's models %s: its learning rate stays %g; "
                "set optimizer.lr to choose one",
                model,
                sorted(PAPER_LEARNING_RATES),
                FALLBACK_LEARNING_RATE,
            )
        data["optimizer"]["lr"] = PAPER_LEARNING_RATES.get(str(model), FALLBACK_LEARNING_RATE)
    method = data.get("method") or {}
    if method.get("name") == "fixed" and not method.get("weights"):
        # The paper's uniform baseline needs a choice of target mass; without one, every
        # fine-tuning dataset gets the same weight.
        method["weights"] = {
            d["name"]: 1.0 for d in data["datasets"] if d.get("role") != "constraint"
        }
    try:
        return RunConfig.from_dict(data)
    except ConfigError as err:
        raise ConfigError(f"{name}: {err}") from None

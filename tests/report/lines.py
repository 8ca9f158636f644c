"""Records as a run folder holds them, for report tests: an update line of
``controller.jsonl`` and an evaluation line of ``metrics.jsonl`` with only what a test sets
differing from a plain run's."""

from __future__ import annotations

from typing import Any

import numpy as np

from dynamics.core.records import EvaluationLine, UpdateRecord


def update(step: int, weights: list[float], horizon: int = 4, **fields: Any) -> UpdateRecord:
    """An update at ``step`` that chose ``weights``; ``fields`` are the record's others."""
    return UpdateRecord(
        **{
            "policy": "dynamics",
            "step": step,
            "horizon": horizon,
            "probe_budget": 1,
            "weights": np.array(weights, dtype=float),
            "current_losses": np.zeros(3),
            "recycled_anchor": False,
            **fields,
        }
    )


def evaluation(
    step: int, means: dict[str, float], batches: dict[str, list[float]] | None = None
) -> EvaluationLine:
    """A main evaluation at ``step`` with the same ``means`` on both splits."""
    return EvaluationLine(
        step=step,
        eval=means,
        test=means,
        weights={},
        target_loss_sum=0.0,
        constraint_slack={},
        feasible=False,
        backtracked=False,
        wall_seconds=0.0,
        eval_batches=batches,
    )

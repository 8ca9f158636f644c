"""Plain-data records a run produces: one per main evaluation, one per mixture update.

These are what the run folder stores (``metrics.jsonl``, ``controller.jsonl``) and what
metrics and reports read back; nothing here refers to a live model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dynamics.core.rules.record import RulesRecord


def _array(values: Any) -> np.ndarray:
    # JSON holds NaN as null (see _plain); a float array reads null back as NaN.
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _plain(value: Any) -> Any:
    """Convert numpy values (recursively) to JSON-able Python; NaN becomes None."""
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


@dataclass
class EvaluationRecord:
    """A main evaluation at ``step``: per-domain mean metric on the eval and test splits
    (lower is better: loss, or negative accuracy), the mixture weights in force, and the
    eval split's per-batch values (what a checkpoint's standard errors are computed from)."""

    step: int
    eval: np.ndarray  # (M,)
    test: np.ndarray  # (M,)
    weights: (
        np.ndarray
    )  # (N,) weights used for the steps that follow, in the run's unit (core.shares)
    wall_seconds: float = 0.0
    backtracked: bool = False  # the run returned from this state to an earlier one
    eval_batches: np.ndarray | None = None  # (M, B); None in records written without them

    def to_dict(self) -> dict[str, Any]:
        return _plain(asdict(self))

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> EvaluationRecord:
        """The inverse of :meth:`to_dict`."""
        return cls(
            step=int(row["step"]),
            eval=_array(row["eval"]),
            test=_array(row["test"]),
            weights=_array(row["weights"]),
            wall_seconds=float(row["wall_seconds"]),
            backtracked=bool(row["backtracked"]),
            eval_batches=None
            if row.get("eval_batches") is None
            else np.array(row["eval_batches"], dtype=float),
        )


@dataclass
class UpdateRecord:
    """One mixture update (one iteration of Algorithm 2's ``if t in U`` branch).

    ``realized_losses`` is filled at the next update (or at the end of training) with the
    reduced-evaluation losses actually reached, so prediction error can be measured as
    ``realized_losses - predicted_losses``.

    The loop's own marks (``abandoned``, ``backtrack``, ``margins``) are stored in the run
    folder beside the policy's details, under ``extra`` (docs/method.md lists its keys).
    """

    policy: str
    step: int
    horizon: int
    probe_budget: int
    weights: (
        np.ndarray
    )  # (N,) in the run's unit; token shares keep extra["batch_shares"] (core.shares)
    current_losses: np.ndarray  # (M,) reduced-evaluation anchor L_i(theta_t)
    recycled_anchor: bool  # anchor taken from the main evaluation at this step
    slope_matrix: np.ndarray | None = None  # (M, N)
    predicted_losses: np.ndarray | None = None  # (M,) at step + horizon
    solver: dict[str, Any] | None = None  # lambda, eps, feasible, max_violation, LP result
    realized_losses: np.ndarray | None = None  # (M,) at step + horizon
    probe_seconds: float = 0.0
    dataset_probe_seconds: np.ndarray | None = None  # (N,) wall time of each dataset's probe
    probe_ranks: list[list[int]] | None = None  # per dataset, the processes that probed it
    extra: dict[str, Any] = field(
        default_factory=dict
    )  # the policy's details (predictor, errors, ...)
    abandoned: bool = False  # a later backtrack returned to a state before this update
    backtrack: dict[str, Any] | None = (
        None  # this update decides again after a backtrack: from, to, ...
    )
    margins: dict[str, float] | None = None  # the references' margins learned from past backtracks
    rules: RulesRecord | None = None  # the decision rules' record; stored as extra["robust"]

    _LOOP_MARKS = ("abandoned", "backtrack", "margins")

    @property
    def prediction_error(self) -> np.ndarray | None:
        """Realized minus predicted losses at the next update (None until both exist)."""
        if self.realized_losses is None or self.predicted_losses is None:
            return None
        return self.realized_losses - self.predicted_losses

    def to_dict(self) -> dict[str, Any]:
        out = _plain(asdict(self))
        out.pop("rules")
        if self.rules is not None:
            out["extra"]["robust"] = _plain(self.rules.to_dict())
        marks = {name: out.pop(name) for name in self._LOOP_MARKS}
        if marks["abandoned"]:
            out["extra"]["abandoned"] = True
        for name in ("backtrack", "margins"):
            if marks[name] is not None:
                out["extra"][name] = marks[name]
        error = self.prediction_error
        out["prediction_error"] = None if error is None else _plain(error)
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> UpdateRecord:
        """The inverse of :meth:`to_dict`."""

        def optional(key: str) -> np.ndarray | None:
            return None if row.get(key) is None else _array(row[key])

        slopes = row["slope_matrix"]
        extra = dict(row["extra"])
        rules = extra.pop("robust", None)
        return cls(
            policy=row["policy"],
            step=int(row["step"]),
            horizon=int(row["horizon"]),
            probe_budget=int(row["probe_budget"]),
            weights=_array(row["weights"]),
            current_losses=_array(row["current_losses"]),
            recycled_anchor=bool(row["recycled_anchor"]),
            slope_matrix=None if slopes is None else np.array([_array(r) for r in slopes]),
            predicted_losses=optional("predicted_losses"),
            solver=row["solver"],
            realized_losses=optional("realized_losses"),
            probe_seconds=float(row["probe_seconds"]),
            dataset_probe_seconds=optional("dataset_probe_seconds"),
            probe_ranks=row.get("probe_ranks"),
            abandoned=bool(extra.pop("abandoned", False)),
            backtrack=extra.pop("backtrack", None),
            margins=extra.pop("margins", None),
            rules=None if rules is None else RulesRecord.from_dict(rules),
            extra=extra,
        )


@dataclass
class RunHistory:
    """Everything the loop produced, in order."""

    dataset_names: list[str]
    domain_names: list[str]
    targets: tuple[int, ...]
    constraints: tuple[int, ...]
    evaluations: list[EvaluationRecord] = field(default_factory=list)
    updates: list[UpdateRecord] = field(default_factory=list)
    backtracks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def kept_evaluations(self) -> list[EvaluationRecord]:
        """The main evaluations of the states the run kept (not those it backtracked from)."""
        return [e for e in self.evaluations if not e.backtracked]

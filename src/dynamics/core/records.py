"""Plain-data records a run produces, and the lines of the run folder that hold them.

:class:`EvaluationRecord` and :class:`UpdateRecord` are what the loop produces, one per main
evaluation and one per mixture update; :class:`UpdateRecord` is also a line of
``controller.jsonl``. :class:`EvaluationLine` is a line of ``metrics.jsonl`` (a main
evaluation with its values named and its feasibility judged), and :class:`CheckpointRecord`
the best checkpoint in ``summary.json``. Each is written with ``to_dict`` and read back with
``from_dict``, so the writer and every reader share one definition of what a line holds;
nothing here refers to a live model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from dynamics.core.rules.record import RulesRecord


def _array(values: Any) -> np.ndarray:
    # JSON holds NaN as null (see _plain); a float array reads null back as NaN.
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _matrix(rows: Any) -> np.ndarray:
    return np.array([_array(row) for row in rows], dtype=float)


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


def _as_is(value: Any) -> Any:
    return value


def held(
    *,
    read: Callable[[Any], Any] = _as_is,
    write: Callable[[Any], Any] = _as_is,
    in_extra: bool = False,
    key: str | None = None,
    report: str | None = None,
) -> dict[str, Any]:
    """The metadata of an :class:`UpdateRecord` field that says how its ``controller.jsonl``
    line holds it: ``write`` turns the field into JSON-able values and ``read`` turns them
    back into the field's type (None stays None), ``in_extra`` places it in the line's
    ``extra`` object (left out while None or False), ``key`` names it there when the name
    differs from the field's, and ``report`` is the column title under which
    ``dynamics report`` shows it per update (not shown without one)."""
    return {"read": read, "write": write, "in_extra": in_extra, "key": key, "report": report}


def _key(spec: Any) -> str:
    return spec.metadata.get("key") or spec.name


@dataclass
class EvaluationRecord:
    """A main evaluation at ``step``: per-domain mean metric on the eval and test splits
    (lower is better: loss, or negative accuracy), the mixture weights in force, and the
    eval split's per-batch values (what a checkpoint's standard errors are computed from)."""

    step: int
    eval: np.ndarray  # (M,)
    test: np.ndarray  # (M,)
    # (N,) weights used for the steps that follow, in the run's unit (core.shares)
    weights: np.ndarray
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
class EvaluationLine:
    """A line of ``metrics.jsonl``: a main evaluation with its values named by domain (and
    its weights by dataset), the targets' summed eval value, each constraint's slack
    (reference - value on the eval split, >= 0 holds), and whether it is a feasible
    checkpoint. ``eval_batches`` holds the eval split's per-batch values of each domain."""

    step: int
    eval: dict[str, float]
    test: dict[str, float]
    weights: dict[str, float]  # empty before any mixture was chosen
    target_loss_sum: float
    constraint_slack: dict[str, float]
    feasible: bool
    backtracked: bool
    wall_seconds: float
    eval_batches: dict[str, list[float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = _plain(asdict(self))
        if self.eval_batches is None:
            del out["eval_batches"]
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> EvaluationLine:
        """The inverse of :meth:`to_dict`."""
        return cls(
            step=int(row["step"]),
            eval=_floats(row["eval"]),
            test=_floats(row["test"]),
            weights=_floats(row["weights"]),
            target_loss_sum=float(row["target_loss_sum"]),
            constraint_slack=_floats(row["constraint_slack"]),
            feasible=bool(row["feasible"]),
            backtracked=bool(row.get("backtracked", False)),
            wall_seconds=float(row["wall_seconds"]),
            eval_batches=None
            if row.get("eval_batches") is None
            else {name: [float(v) for v in values] for name, values in row["eval_batches"].items()},
        )


def _floats(named: dict[str, Any]) -> dict[str, float]:
    return {name: float(value) for name, value in named.items()}


@dataclass
class CheckpointRecord:
    """The best feasible checkpoint of ``summary.json``: its step, its values on both splits
    by domain, and its folder relative to the run folder."""

    step: int
    eval: dict[str, float]
    test: dict[str, float]
    path: str

    def to_dict(self) -> dict[str, Any]:
        return _plain(asdict(self))

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> CheckpointRecord:
        """The inverse of :meth:`to_dict`."""
        return cls(
            step=int(row["step"]),
            eval=_floats(row["eval"]),
            test=_floats(row["test"]),
            path=str(row["path"]),
        )


@dataclass
class UpdateRecord:
    """One mixture update (one iteration of Algorithm 2's ``if t in U`` branch), and a line
    of ``controller.jsonl``.

    ``realized_losses`` is filled at the next update (or at the end of training) with the
    reduced-evaluation losses actually reached, so prediction error can be measured as
    ``realized_losses - predicted_losses``.

    The policy's details and the loop's own marks (``abandoned``, ``backtrack``,
    ``margins``) are stored in the line's ``extra`` object (docs/method.md lists its keys).
    A new field is one field here, with :func:`held` metadata: the line holds it, every
    reader reads it, and with ``report=`` ``dynamics report`` shows it.
    """

    policy: str
    step: int
    horizon: int
    probe_budget: int
    # (N,) in the run's unit; under token shares batch_shares holds the batch shares
    weights: np.ndarray = field(metadata=held(read=_array))
    # (M,) reduced-evaluation anchor L_i(theta_t)
    current_losses: np.ndarray = field(metadata=held(read=_array))
    # the anchor is the main evaluation's of this step
    recycled_anchor: bool = field(metadata=held(read=bool))
    # (M, N) S(t), the predicted change of each domain per step on each dataset
    slope_matrix: np.ndarray | None = field(default=None, metadata=held(read=_matrix))
    # (M,) at step + horizon
    predicted_losses: np.ndarray | None = field(default=None, metadata=held(read=_array))
    solver: dict[str, Any] | None = None  # lambda, eps, feasible, max_violation, LP result
    # (M,) at step + horizon
    realized_losses: np.ndarray | None = field(default=None, metadata=held(read=_array))
    probe_seconds: float = field(default=0.0, metadata=held(read=float, report="probe seconds"))
    # (N,) wall time of each dataset's probe
    dataset_probe_seconds: np.ndarray | None = field(default=None, metadata=held(read=_array))
    probe_ranks: list[list[int]] | None = None  # per dataset, the processes that probed it
    # The policy's details.
    # the slope predictor (method.predictor)
    predictor: str | None = field(default=None, metadata=held(in_extra=True))
    # (M, N) the curve family behind each slope (core.predictors.SlopeFit)
    slope_models: list[list[str | None]] | None = field(default=None, metadata=held(in_extra=True))
    # (M, N) True where the extrapolation guard replaced a fitted curve by the linear one
    extrapolation_guarded: list[list[bool | None]] | None = field(
        default=None, metadata=held(in_extra=True)
    )
    # (M, N) standard error of each slope; NaN for a dataset left out of the solve
    slope_errors: np.ndarray | None = field(
        default=None, metadata=held(read=_matrix, in_extra=True)
    )
    # how accuracy slopes were measured ("expected", or why not), for accuracy domains
    accuracy_slopes: str | None = field(default=None, metadata=held(in_extra=True))
    # (N,) the batch shares trained under training.sampling: tokens (weights are token shares)
    batch_shares: np.ndarray | None = field(default=None, metadata=held(read=_array, in_extra=True))
    # the datasets whose probes diverged, left out of this update's solve
    unreliable_datasets: list[str] | None = field(default=None, metadata=held(in_extra=True))
    # the decision rules' record (core.rules), stored under extra["robust"]
    rules: RulesRecord | None = field(
        default=None,
        metadata=held(
            read=RulesRecord.from_dict, write=RulesRecord.to_dict, in_extra=True, key="robust"
        ),
    )
    # The loop's marks.
    # a later backtrack returned to a state before this update
    abandoned: bool = field(default=False, metadata=held(read=bool, in_extra=True))
    # this update decides again after a backtrack: from, to, ...
    backtrack: dict[str, Any] | None = field(default=None, metadata=held(in_extra=True))
    # the references' margins learned from past backtracks
    margins: dict[str, float] | None = field(default=None, metadata=held(in_extra=True))

    @classmethod
    def report_columns(cls) -> list[tuple[str, str]]:
        """``(column title, field name)`` of every field ``dynamics report`` shows per
        update: those whose :func:`held` metadata names a ``report`` column."""
        return [(spec.metadata["report"], spec.name) for spec in fields(cls) if _shown(spec)]

    @property
    def prediction_error(self) -> np.ndarray | None:
        """Realized minus predicted losses at the next update (None until both exist)."""
        if self.realized_losses is None or self.predicted_losses is None:
            return None
        return self.realized_losses - self.predicted_losses

    @property
    def trained_shares(self) -> np.ndarray:
        """The shares of this update's steps drawn from each dataset, the mixture its
        predictions assume: its batch shares where it keeps them (token-share weights),
        else its weights."""
        return self.weights if self.batch_shares is None else self.batch_shares

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if value is not None:
                value = spec.metadata.get("write", _as_is)(value)
            if not spec.metadata.get("in_extra"):
                out[_key(spec)] = _plain(value)
            elif value is not None and value is not False:
                extra[_key(spec)] = _plain(value)
        out["extra"] = extra
        error = self.prediction_error
        out["prediction_error"] = None if error is None else _plain(error)
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> UpdateRecord:
        """The inverse of :meth:`to_dict` (a ``controller.jsonl`` line's other keys, its
        ``dataset_names`` and ``prediction_error``, are left: the summary and
        :attr:`prediction_error` hold them)."""
        extra = row.get("extra", {})
        specs = fields(cls)
        unknown = sorted(set(extra) - {_key(s) for s in specs if s.metadata.get("in_extra")})
        if unknown:
            raise ValueError(f"extra.{unknown[0]} is not a field of an update record")
        values = {}
        for spec in specs:
            source = extra if spec.metadata.get("in_extra") else row
            if source.get(_key(spec)) is not None:
                values[spec.name] = spec.metadata.get("read", _as_is)(source[_key(spec)])
        values["step"], values["horizon"] = int(row["step"]), int(row["horizon"])
        values["probe_budget"] = int(row["probe_budget"])
        return cls(**values)


def _shown(spec: Any) -> bool:
    return bool(spec.metadata.get("report"))


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

"""``target_floor`` (f in [0, 1), 0: off; set as ``method.floors.targets``): every target
dataset (one named like a target domain) keeps at least f of the mixture at every update,
inside the solver (so the other weights are chosen knowing it, in the fallback too), unless
the floor alone stands between the mixture and the constraints: no floored mixture is
predicted to keep them all, and one without the floor is. Then it gives way for that update,
and the record says which constraints the floor would have broken
(:func:`dynamics.core.decisions.target_floor`). The floor on every dataset, target or not,
is ``method.floors.all``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dynamics.core.decisions import target_floor
from dynamics.core.robust import RobustProblem
from dynamics.core.rules.base import Params, Rule, UpdateStep, described, register


@dataclass(frozen=True)
class TargetFloorParams(Params):
    target_floor: float = described(
        0.0,
        "The least weight of every target dataset (one named like a target domain) at every "
        "update, given way where no mixture with it but one without it is predicted to keep "
        "every constraint (0: none, as the paper).",
        ge=0,
        lt=1,
    )

    def __post_init__(self) -> None:
        f = self.target_floor
        if not (math.isfinite(f) and 0 <= f < 1):
            raise ValueError(f"method.floors.targets must be in [0, 1) (0: off), got {f}")


@dataclass(frozen=True)
class FloorDecision:
    """What the floor did at one update: the floor, the target datasets' columns it held,
    the constraints that made it give way (empty: it held), and whether no mixture, floored
    or not, was predicted to keep every constraint (the floor then held)."""

    floor: float
    target_datasets: list[int]
    lifted_by: list[int]
    no_mixture_feasible: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "floor": self.floor,
            "target_datasets": list(self.target_datasets),
            "lifted_by": list(self.lifted_by),
        }
        if self.no_mixture_feasible:
            out["no_mixture_feasible"] = True
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> FloorDecision:
        return cls(
            floor=float(row["floor"]),
            target_datasets=[int(j) for j in row["target_datasets"]],
            lifted_by=[int(c) for c in row["lifted_by"]],
            no_mixture_feasible=bool(row.get("no_mixture_feasible", False)),
        )


@dataclass(frozen=True)
class TargetFloorRecord(TargetFloorParams):
    """The parameter and this update's :class:`FloorDecision`."""

    floors: FloorDecision | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target_floor": self.target_floor}
        if self.floors is not None:
            out["floors"] = self.floors.to_dict()
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> TargetFloorRecord:
        floors = row.get("floors")
        return cls(
            float(row["target_floor"]),
            None if floors is None else FloorDecision.from_dict(floors),
        )


class TargetFloor(Rule[TargetFloorParams]):
    name = "target_floor"
    params_type = TargetFloorParams
    record_type = TargetFloorRecord
    config_paths: ClassVar[dict[str, str]] = {"target_floor": "method.floors.targets"}

    def __init__(self, params: TargetFloorParams) -> None:
        super().__init__(params)
        self._decision: FloorDecision | None = None

    def shape(self, robust: RobustProblem, step: UpdateStep) -> RobustProblem:
        floored, decision = target_floor(robust, step.target_datasets, self.params.target_floor)
        self._decision = FloorDecision.from_dict(decision)
        return floored

    def record(self) -> TargetFloorRecord:
        return TargetFloorRecord(self.params.target_floor, self._decision)


register(TargetFloor)

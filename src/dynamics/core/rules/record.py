"""The rules' record of one update: each rule's record (its parameters and what it decided)
and the candidate the update kept. Stored flat as ``extra["robust"]`` of the update's row
in ``controller.jsonl``; :meth:`RulesRecord.from_dict` reads it back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dynamics.core.robust import RobustChoice
from dynamics.core.rules.base import RULES, P, Params


@dataclass(frozen=True)
class ChoiceRecord:
    """The candidate an update kept: its weights (batch shares), where it came from
    ("grid" or an added candidate's source), whether it keeps every constraint under the
    rules' predictions, its largest violation (>= 0) and its target objective."""

    weights: list[float]
    source: str
    feasible: bool
    max_violation: float
    objective: float

    @classmethod
    def of(cls, choice: RobustChoice) -> ChoiceRecord:
        return cls(**choice.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights": list(self.weights),
            "source": self.source,
            "feasible": self.feasible,
            "max_violation": self.max_violation,
            "objective": self.objective,
        }

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> ChoiceRecord:
        objective = row["objective"]
        return cls(
            weights=[float(w) for w in row["weights"]],
            source=str(row["source"]),
            feasible=bool(row["feasible"]),
            max_violation=float(row["max_violation"]),
            objective=float("nan") if objective is None else float(objective),
        )


@dataclass(frozen=True)
class RulesRecord:
    """What the rules of one update recorded, in the registry's order, and the kept choice."""

    rules: tuple[Params, ...]
    choice: ChoiceRecord

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for rule in self.rules:
            out.update(rule.to_dict())
        out.update(self.choice.to_dict())
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> RulesRecord:
        """The inverse of :meth:`to_dict`; a rule whose name is not in ``row`` was off."""
        rules = tuple(rule.read_record(row) for name, rule in RULES.items() if name in row)
        return cls(rules, ChoiceRecord.from_dict(row))

    def find(self, params_type: type[P]) -> P:
        """The record of the rule with ``params_type`` (a subclass of it where the rule
        records a decision), or its off values where the rule was off."""
        return next((r for r in self.rules if isinstance(r, params_type)), params_type())

"""The mixture policies by name (``method.name``): a policy is a class with
``from_settings`` and one line in :data:`POLICIES`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dynamics.core.policies import DynamicsPolicy, FixedWeightsPolicy, GradientAlignmentPolicy
from dynamics.core.policy_interface import MixturePolicy
from dynamics.core.problem import SolverGrid
from dynamics.core.rules import RuleSet
from dynamics.core.shares import BatchShares, MixtureUnit


@dataclass(frozen=True)
class PolicySettings:
    """What a policy is built from: the run's fine-tuning datasets, its length, the weights'
    unit and the ``method`` section's settings (docs/config.md says what each means)."""

    dataset_names: Sequence[str]
    total_steps: int
    unit: MixtureUnit = field(default_factory=BatchShares)
    schedule: str | list[int] = "dense-warmup"
    probe_cap: int | None = None
    probe_min: int = 1
    grid: SolverGrid = field(default_factory=SolverGrid)
    predictor: str = "linear"
    rules: RuleSet = field(default_factory=RuleSet)
    min_weight: float = 0.0
    weights: dict[str, float] | None = None
    alignment_batches: int = 200


class PolicyType(Protocol):
    def from_settings(self, settings: PolicySettings) -> MixturePolicy: ...


POLICIES: dict[str, PolicyType] = {
    "dynamics": DynamicsPolicy,
    "fixed": FixedWeightsPolicy,
    "gradient-alignment": GradientAlignmentPolicy,
}
"""``method.name`` -> the policy class it runs."""

"""What a mixture policy sees at an update and what it promises the controller
(:class:`dynamics.core.controller.MixtureController` calls :meth:`MixturePolicy.decide`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dynamics.core.learner import DomainKind, Evaluation, Learner
from dynamics.core.records import UpdateRecord
from dynamics.core.schedules import UpdateSchedule


@dataclass(frozen=True)
class UpdateContext:
    """What a policy sees at update step ``step``.

    anchor:            reduced evaluation at theta_t, shape (M, R) per batch.
    reference_losses:  step-0 values on the same R batches, NaN for non-constraints
                       (the solver's references use the probe's batches), lowered by
                       the margins backtracking learned.
    domain_kinds:      each domain's metric and evaluation batch size.
    """

    step: int
    horizon: int
    probe_budget: int
    anchor: Evaluation
    recycled_anchor: bool
    reference_losses: np.ndarray
    targets: tuple[int, ...]
    constraints: tuple[int, ...]
    reduced_batches: int
    domain_kinds: tuple[DomainKind, ...]
    after_backtrack: bool = False  # the learner was just returned to this step's state


class MixturePolicy(Protocol):
    """A way of choosing mixture weights: DynaMiCS, fixed weights, gradient alignment."""

    @property
    def name(self) -> str: ...

    @property
    def schedule(self) -> UpdateSchedule:
        """When the policy recomputes weights; always contains step 0."""
        ...

    def decide(self, learner: Learner, context: UpdateContext) -> UpdateRecord:
        """Return the update record (with the new weights). The learner must be left in
        exactly the state it was given in."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What the policy carries from one update to the next (JSON-able), for resume."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

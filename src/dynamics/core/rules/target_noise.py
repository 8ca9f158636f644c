"""``target_noise`` (z >= 0; acts through ``lp_candidate``): the target objective is scored
pessimistically, ``g.w + z ||tau * w||`` with ``tau_j`` the standard error of the summed
target slope of dataset j (:class:`dynamics.core.robust.RobustProblem`).

Two datasets whose target slopes differ by less than their noise then share the weight
instead of one of them taking all of it (without it, eq. 3.4 with no active constraint is
linear and always picks a vertex). The grid's candidates minimise the nominal objective;
only the direct candidate minimises the pessimistic one, hence the requirement."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dynamics.core.robust import RobustProblem
from dynamics.core.rules.base import Params, Rule, UpdateStep, described, register


@dataclass(frozen=True)
class TargetNoiseParams(Params):
    target_noise: float = described(
        0.0,
        "Score the target objective this many standard errors pessimistically (0: none, as "
        "the paper).",
        ge=0,
    )

    def __post_init__(self) -> None:
        z = self.target_noise
        if not (math.isfinite(z) and z >= 0):
            raise ValueError(
                f"method.target_noise must be a number >= 0 (standard errors), got {z}"
            )


class TargetNoise(Rule[TargetNoiseParams]):
    name = "target_noise"
    params_type = TargetNoiseParams
    requires = ("lp_candidate",)

    def shape(self, robust: RobustProblem, step: UpdateStep) -> RobustProblem:
        return replace(robust, target_z=self.params.target_noise)


register(TargetNoise)

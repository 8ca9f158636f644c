"""``gain_exponent`` (p in (0, 1], 1: off; acts through ``lp_candidate``): diminishing
returns beyond the probe (:func:`dynamics.core.robust.predicted_changes`).

Dataset j trains ``w_j H_t`` steps until the next update, ``u_j = w_j H_t / c_t`` probe
lengths. An improvement its probe measured (a negative slope) is extrapolated as
``c_t S_ij phi(u_j)`` with ``phi(u) = u`` up to one probe length and ``1 + (u^p - 1) / p``
beyond it (a power, joined to the line with the same slope at u = 1); a harm (a positive
slope) stays linear. Every prediction is then convex in w and never more optimistic than
eq. 3.3, equal to it whenever no dataset trains longer than its probe did, and with no
constraint binding the optimum shares weight between datasets instead of giving all of it
to one. Only the direct candidate optimises this prediction, hence the requirement."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dynamics.core.robust import RobustProblem
from dynamics.core.rules.base import Params, Rule, UpdateStep, described, register


@dataclass(frozen=True)
class GainExponentParams(Params):
    gain_exponent: float = described(
        1.0,
        "Diminishing returns: an improvement extrapolated past the probe's length grows as a "
        "power with this exponent instead of linearly (1: linear, as the paper).",
        gt=0,
        le=1,
    )

    def __post_init__(self) -> None:
        p = self.gain_exponent
        if not (math.isfinite(p) and 0 < p <= 1):
            raise ValueError(
                f"method.gain_exponent must be in (0, 1] (1: linear, as eq. 3.3), got {p}"
            )


class GainExponent(Rule[GainExponentParams]):
    name = "gain_exponent"
    params_type = GainExponentParams
    requires = ("lp_candidate",)

    def shape(self, robust: RobustProblem, step: UpdateStep) -> RobustProblem:
        return replace(robust, gain_exponent=self.params.gain_exponent)


register(GainExponent)

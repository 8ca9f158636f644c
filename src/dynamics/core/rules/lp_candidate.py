"""``lp_candidate``: the hard-constrained program (eq. 3.1 with the prediction of eq. 3.3, or
the robust problem the other rules shape) is solved directly and its optimum joins the
(lambda, eps) grid's candidates (:func:`dynamics.core.robust.solve_direct`).

The grid alone can miss a feasible interior mixture that lies between its lambda values, and
an eps > 0 margin can be unreachable when ``H_t |S|`` is far below eps; the direct optimum
cannot. With no feasible mixture the direct candidate is the one with the smallest largest
violation. Where its SLSQP run reports no success, the record keeps the message
(``solver_failure``); the answer is checked and used like any other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dynamics.core.robust import RobustProblem, solve_direct
from dynamics.core.rules.base import Candidate, Params, Rule, UpdateStep, described, register


@dataclass(frozen=True)
class LpCandidateParams(Params):
    lp_candidate: bool = described(
        False,
        "Add the directly solved constrained optimum to the (lambda, eps) grid's candidates "
        "(target_noise and gain_exponent act through it).",
    )

    def __post_init__(self) -> None:
        if not isinstance(self.lp_candidate, bool):
            raise ValueError(
                f"method.lp_candidate must be true or false, got {self.lp_candidate!r}"
            )


@dataclass(frozen=True)
class LpCandidateRecord(LpCandidateParams):
    """The parameter, and SLSQP's message where it reported no success (None: it did)."""

    solver_failure: str | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lp_candidate": self.lp_candidate}
        if self.solver_failure is not None:
            out["solver_failure"] = self.solver_failure
        return out


class LpCandidate(Rule[LpCandidateParams]):
    name = "lp_candidate"
    params_type = LpCandidateParams
    record_type = LpCandidateRecord

    def __init__(self, params: LpCandidateParams) -> None:
        super().__init__(params)
        self._failure: str | None = None

    def candidates(self, robust: RobustProblem, step: UpdateStep) -> list[Candidate]:
        direct = solve_direct(robust)
        # SLSQP's verdict, for the record only. Its answer was checked (feasible, no worse
        # than the point it started from), and the verdict can flip under rounding while the
        # answer stays where it is, so it does not decide the mixture.
        self._failure = None if direct.converged else direct.message
        return [Candidate("direct", direct.weights)]

    def record(self) -> LpCandidateRecord:
        return LpCandidateRecord(self.params.lp_candidate, self._failure)


register(LpCandidate)

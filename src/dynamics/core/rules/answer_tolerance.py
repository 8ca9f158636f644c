"""``answer_tolerance`` (a in [0, 1), 0: off; acts through ``expected_accuracy``): a mixture
keeps an accuracy constraint whose slopes come from expected accuracies if it is predicted to
lose less than ``a`` of one answer of the probe-sized evaluation
(:func:`dynamics.core.resolution.with_answer_tolerance`).

A measured accuracy moves by whole answers, so only the prediction is judged differently: a
drift of the correct choices' probability too small to flip an answer (a = 0.5: one that
rounds to no answer) does not make every mixture look like a broken constraint."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dynamics.core.problem import MixtureProblem
from dynamics.core.resolution import with_answer_tolerance
from dynamics.core.rules.base import Params, Rule, UpdateStep, described, register


@dataclass(frozen=True)
class AnswerToleranceParams(Params):
    answer_tolerance: float = described(
        0.0,
        "A mixture predicted to lose less than this fraction of one answer of an accuracy "
        "constraint (on the probes' evaluation) counts as keeping it, so "
        "that a drift of the correct choices' probability too small to flip an answer does not "
        "break every mixture (0: off, as the paper).",
        ge=0,
        lt=1,
    )

    def __post_init__(self) -> None:
        a = self.answer_tolerance
        if not (math.isfinite(a) and 0 <= a < 1):
            raise ValueError(
                f"method.answer_tolerance must be in [0, 1) (a fraction of one answer), got {a}"
            )


class AnswerTolerance(Rule[AnswerToleranceParams]):
    name = "answer_tolerance"
    params_type = AnswerToleranceParams
    requires = ("expected_accuracy",)

    def tolerate(self, problem: MixtureProblem, step: UpdateStep) -> MixtureProblem:
        if step.accuracy_slopes != "expected":
            return problem  # the learner reported no expected accuracy: answers were counted
        return with_answer_tolerance(problem, step.questions, self.params.answer_tolerance)


register(AnswerTolerance)

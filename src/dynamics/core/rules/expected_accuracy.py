"""``expected_accuracy``: an accuracy constraint's slopes are the change of its expected
accuracy (the mean probability the model gives the correct choice) per probe step, not the
change of the share of answers right, and their standard errors are the spread of those
paired changes over the batches, without the binomial floor
(:func:`dynamics.core.probes.measured_changes`).

A short probe rarely flips an answer, so a measured accuracy slope is mostly zero or one
answer's worth, and no mixture is then predicted to win back a lost answer; the probability
of the correct choice moves before the answer does. The predicted accuracy is the measured
one plus the horizon times that slope."""

from __future__ import annotations

from dataclasses import dataclass

from dynamics.core.rules.base import Measurement, Params, Rule, described, register


@dataclass(frozen=True)
class ExpectedAccuracyParams(Params):
    expected_accuracy: bool = described(
        False,
        "Read each accuracy constraint's slopes from the change of its expected accuracy (the "
        "mean probability of the correct choice), which short probes move before any answer "
        "flips, instead of from the answers that flipped (false: as the paper).",
    )

    def __post_init__(self) -> None:
        if not isinstance(self.expected_accuracy, bool):
            raise ValueError(
                f"method.expected_accuracy must be true or false, got {self.expected_accuracy!r}"
            )


class ExpectedAccuracy(Rule[ExpectedAccuracyParams]):
    name = "expected_accuracy"
    params_type = ExpectedAccuracyParams

    def measure(self, measurement: Measurement) -> Measurement:
        return Measurement(expected_accuracy=True)


register(ExpectedAccuracy)

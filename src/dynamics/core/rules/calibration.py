"""``calibration``: a per-step bias per constraint learned from past updates' misses, which
only tightens (:class:`dynamics.core.decisions.PredictionCalibration`). Each update's
current losses are shifted by the bias times the horizon before the update decides; the
decided mixture's uncorrected prediction is what the next update learns from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dynamics.core.decisions import PredictionCalibration, calibrated
from dynamics.core.problem import MixtureProblem
from dynamics.core.rules.base import Params, Rule, UpdateStep, described, register


@dataclass(frozen=True)
class CalibrationParams(Params):
    calibration: bool = described(
        False, "Correct predictions by the per-step error realized at past updates."
    )

    def __post_init__(self) -> None:
        if not isinstance(self.calibration, bool):
            raise ValueError(f"method.calibration must be true or false, got {self.calibration!r}")


class Calibration(Rule[CalibrationParams]):
    name = "calibration"
    params_type = CalibrationParams

    def __init__(self, params: CalibrationParams) -> None:
        super().__init__(params)
        self._calibration: PredictionCalibration | None = None
        self._last_prediction: tuple[np.ndarray, int] | None = None

    def correct(self, problem: MixtureProblem, step: UpdateStep) -> MixtureProblem:
        if self._calibration is None:
            self._calibration = PredictionCalibration(len(problem.current_losses))
        # After a backtrack the last prediction's horizon was never completed.
        if self._last_prediction is not None and not step.context.after_backtrack:
            predicted, horizon = self._last_prediction
            self._calibration.observe(predicted, problem.current_losses, horizon)
        step.extra["calibration_bias"] = bias = self._calibration.bias(step.context.horizon)
        return calibrated(problem, bias)

    def learn(self, predicted: np.ndarray, horizon: int) -> None:
        self._last_prediction = (predicted, horizon)

    def state_dict(self) -> dict[str, Any]:
        """The calibration's sums and the last prediction (what the next update learns from)."""
        last = self._last_prediction
        return {
            "calibration": None if self._calibration is None else self._calibration.state_dict(),
            "last_prediction": None
            if last is None
            else {"losses": last[0].tolist(), "horizon": last[1]},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("calibration")
        self._calibration = None if saved is None else PredictionCalibration.from_state_dict(saved)
        last = state.get("last_prediction")
        self._last_prediction = (
            None
            if last is None
            else (np.asarray(last["losses"], dtype=float), int(last["horizon"]))
        )


register(Calibration)

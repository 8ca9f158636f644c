"""How well eq. 3.3's predictions held over a run's long horizons, read from update records
(``prediction_errors`` of benchmarks/robustness.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynamics.core.records import UpdateRecord
from robustness import prediction_errors

NAMES = ["target", "held-out", "quiz"]


def update(
    step: int,
    horizon: int,
    losses: list[float],
    slopes: list[list[float]],
    weights: list[float],
    **details,
) -> UpdateRecord:
    return UpdateRecord(
        policy="dynamics",
        step=step,
        horizon=horizon,
        probe_budget=1,
        weights=np.array(weights),
        current_losses=np.array(losses),
        recycled_anchor=False,
        slope_matrix=np.array(slopes),
        **details,
    )


SLOPES = [[-1e-2, 0.0], [1e-3, -1e-3], [2e-3, 0.0]]


def test_each_long_horizon_is_scored_against_the_next_anchor_and_against_no_change():
    updates = [
        update(0, 8, [3.0, 1.0, -0.5], SLOPES, [1.0, 0.0]),  # too short: a warmup update
        update(8, 32, [2.9, 1.0, -0.5], SLOPES, [0.5, 0.5]),  # predicts held-out 0, quiz +0.032
        update(
            40, 64, [2.5, 1.02, -0.52], SLOPES, [1.0, 0.0]
        ),  # predicts held-out +0.064, quiz +0.128
        update(104, 64, [2.0, 1.05, -0.4], SLOPES, [1.0, 0.0]),  # its horizon never finished
    ]
    errors = prediction_errors([(updates, NAMES, [1, 2])])
    assert set(errors) == {"held-out", "quiz"}  # constraints only
    held_out, quiz = errors["held-out"], errors["quiz"]
    assert held_out["horizons"] == quiz["horizons"] == 2
    # Realized: held-out +0.02 then +0.03; quiz -0.02 then +0.12.
    assert held_out["prediction_error"] == pytest.approx((0.02 + abs(0.03 - 0.064)) / 2)
    assert held_out["no_change_error"] == pytest.approx((0.02 + 0.03) / 2)
    assert quiz["prediction_error"] == pytest.approx((abs(-0.02 - 0.032) + abs(0.12 - 0.128)) / 2)
    assert quiz["no_change_error"] == pytest.approx((0.02 + 0.12) / 2)
    assert quiz["correlation"] == pytest.approx(1.0)  # two points always lie on a line


def test_abandoned_updates_and_interrupted_horizons_are_left_out():
    updates = [
        update(0, 32, [3.0, 1.0, -0.5], SLOPES, [1.0, 0.0], abandoned=True),
        update(0, 32, [3.0, 1.0, -0.5], SLOPES, [0.0, 1.0]),
        update(16, 32, [3.0, 1.0, -0.5], SLOPES, [0.0, 1.0]),  # the one before did not end here
        update(48, 32, [2.8, 0.97, -0.5], SLOPES, [0.0, 1.0]),
    ]
    errors = prediction_errors([(updates, NAMES, [1])])
    assert errors["held-out"]["horizons"] == 1
    assert errors["held-out"]["prediction_error"] == pytest.approx(abs(-0.03 - (-0.032)))
    assert math.isnan(errors["held-out"]["correlation"])  # one horizon: no correlation to speak of


def test_under_token_sampling_the_prediction_uses_the_batch_shares_trained():
    # Token shares 0.2 / 0.8 of batch shares 0.5 / 0.5: held-out is predicted 0, quiz +0.032.
    def pair(**shares) -> list[dict]:
        return [
            update(8, 32, [2.9, 1.0, -0.5], SLOPES, [0.2, 0.8], **shares),
            update(40, 64, [2.5, 1.02, -0.52], SLOPES, [1.0, 0.0]),
        ]

    errors = prediction_errors([(pair(batch_shares=[0.5, 0.5]), NAMES, [1, 2])])
    assert errors["held-out"]["prediction_error"] == pytest.approx(0.02)
    assert errors["quiz"]["prediction_error"] == pytest.approx(abs(-0.02 - 0.032))
    # Read as batch shares, the token shares would predict held-out -0.0192 instead.
    by_weights = prediction_errors([(pair(), NAMES, [1, 2])])
    assert by_weights["held-out"]["prediction_error"] == pytest.approx(abs(0.02 + 0.0192))

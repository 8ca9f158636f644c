"""Slope predictors: eq. 3.2 exactly, and curve fits checked against the curves that made the
data."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dynamics.core.predictors import (
    EXPONENTIAL,
    LINEAR,
    POWER_LAW,
    POWER_LAW_OFFSET,
    PREDICTORS,
    aicc,
    curve_slopes,
    linear_slopes,
    probe_progress,
)

# The paper's curve variant: 5 evaluations per probe; horizon 4 probe lengths ahead (u_H = 4).
U = np.arange(1, 6) / 5
PROBE_BUDGET = 128
HORIZON = 4 * PROBE_BUDGET
ANCHOR = 2.0

# Each family with the parameters that generate its synthetic trajectory (as absolute loss).
CURVES = {
    "exponential": lambda u: 1.6 + 0.4 * np.exp(-3.0 * u),
    "power_law_offset": lambda u: -0.25 * u**0.4 + ANCHOR,
    "power_law": lambda u: ANCHOR + 0.05 * u**0.3,  # a constraint degrading, ever more slowly
}


def _one_entry(curve, u=U, horizon=HORIZON, noise=0.0, seed=0):
    """Run the curve predictor on one (domain, dataset) trajectory made by ``curve``."""
    rng = np.random.default_rng(seed)
    values = curve(u) + noise * rng.standard_normal(u.size)
    estimate = curve_slopes(u, values[:, None, None], np.array([curve(0.0)]), horizon, PROBE_BUDGET)
    return (
        horizon * estimate.slope_matrix[0, 0],
        estimate.models[0, 0],
        bool(estimate.guarded[0, 0]),
    )


def test_linear_slopes_are_eq_3_2() -> None:
    anchor = np.array([2.0, 1.0, -0.5])  # the last one a negative accuracy
    probe_end = np.array([[1.5, 2.25], [1.0, 0.75], [-0.25, -0.75]])  # exact in binary
    expected = np.array([[-0.5, 0.25], [0.0, -0.25], [0.25, -0.25]]) / 8
    np.testing.assert_array_equal(linear_slopes(anchor, probe_end, probe_budget=8), expected)


def test_linear_predictor_reads_the_end_of_the_probe() -> None:
    predictor = PREDICTORS["linear"]
    checkpoints = probe_progress(64, predictor.num_probe_evals)
    assert checkpoints == (64,)
    anchor = np.array([2.0, 3.0])
    end = np.array([[1.0, 2.5], [3.5, 3.0]])
    estimate = predictor.slopes(
        anchor=anchor,
        checkpoints=np.array(checkpoints),
        trajectories=end[None],
        probe_budget=64,
        horizon=512,
    )
    np.testing.assert_array_equal(estimate.slope_matrix, linear_slopes(anchor, end, 64))
    assert set(estimate.models.ravel()) == {LINEAR}


@pytest.mark.parametrize("family", sorted(CURVES))
def test_curve_fit_recovers_each_family_four_probe_lengths_ahead(family: str) -> None:
    curve = CURVES[family]
    change, _, guarded = _one_entry(curve)
    assert change == pytest.approx(curve(4.0) - curve(0.0), abs=1e-4)
    assert not guarded


@pytest.mark.parametrize("noise", [0.0, 1e-4])
@pytest.mark.parametrize("family", [EXPONENTIAL, POWER_LAW])
def test_aicc_selects_the_generating_family(family: str, noise: float) -> None:
    _, model, _ = _one_entry(CURVES[family], noise=noise)
    assert model == family


def test_noiseless_power_law_with_offset_is_its_pinned_twin() -> None:
    # a u^b + d passes through d at u = 0, so on noiseless data d is the anchor and the
    # single power law (offset pinned at the anchor) fits just as exactly with one
    # parameter fewer: AICc prefers it, with the same prediction.
    change, model, _ = _one_entry(CURVES["power_law_offset"])
    assert model == POWER_LAW
    assert change == pytest.approx(-0.25 * 4.0**0.4, abs=1e-6)


def test_free_offset_is_selected_when_many_evaluations_miss_the_anchor() -> None:
    # Twenty evaluations on a curve that does not pass through the anchor (the first steps
    # dropped the loss by 0.05 at once): pinning the curve at the anchor no longer fits.
    u = np.arange(1, 21) / 20
    values = 1.9 - 0.1 * u**2
    estimate = curve_slopes(u, values[:, None, None], np.array([1.95]), PROBE_BUDGET, PROBE_BUDGET)
    assert estimate.models[0, 0] == POWER_LAW_OFFSET
    assert PROBE_BUDGET * estimate.slope_matrix[0, 0] == pytest.approx(-0.15, abs=0.01)


def test_low_noise_predictions_stay_close() -> None:
    for family, curve in CURVES.items():
        change, _, _ = _one_entry(curve, noise=1e-4, seed=1)
        assert change == pytest.approx(curve(4.0) - curve(0.0), abs=5e-3), family


def test_accelerating_curve_is_not_extrapolated_beyond_the_linear_prediction() -> None:
    # A constraint degrading faster and faster: the fitted curve would promise 1.6 at
    # u_H = 4. The guard keeps the anchored least-squares line instead.
    curve = lambda u: ANCHOR + 0.1 * u**2  # noqa: E731
    change, model, guarded = _one_entry(curve)
    line_slope = (U @ (curve(U) - ANCHOR)) / (U @ U)
    assert (model, guarded) == (LINEAR, True)
    assert change == pytest.approx(4.0 * line_slope)


def test_accelerating_curve_is_kept_inside_the_probe() -> None:
    # With c_t = H_t (the paper's curve experiments) the horizon is u = 1: interpolation.
    curve = lambda u: ANCHOR + 0.1 * u**2  # noqa: E731
    change, model, guarded = _one_entry(curve, horizon=PROBE_BUDGET)
    assert model != LINEAR and not guarded
    assert change == pytest.approx(0.1, abs=1e-6)


def test_flat_trajectory_falls_back_to_linear() -> None:
    change, model, guarded = _one_entry(lambda u: ANCHOR + 0.0 * u)
    assert (change, model, guarded) == (0.0, LINEAR, False)


def test_two_points_fall_back_to_eq_3_2() -> None:
    # Anchor and end alone: AICc is undefined for every family, and the fallback line
    # through the anchor and the end is exactly the linear predictor.
    anchor = np.array([2.0, 1.5])
    end = np.array([[1.8, 2.2], [1.5, 1.2]])
    estimate = curve_slopes(np.array([1.0]), end[None], anchor, HORIZON, PROBE_BUDGET)
    expected = linear_slopes(anchor, end, PROBE_BUDGET)
    np.testing.assert_allclose(estimate.slope_matrix, expected, rtol=1e-12)
    assert set(estimate.models.ravel()) == {LINEAR}


def test_short_probe_falls_back_to_linear() -> None:
    # c_t = 2 allows only two distinct evaluation steps.
    steps = probe_progress(2, PREDICTORS["curve"].num_probe_evals)
    assert steps == (1, 2)
    u = np.array(steps) / 2
    values = np.array([1.9, 1.85])
    estimate = curve_slopes(u, values[:, None, None], np.array([2.0]), 64, 2)
    assert estimate.models[0, 0] == LINEAR


def test_no_warnings_leak_from_failing_fits() -> None:
    # A straight line makes the exponential fit run off to a zero rate; overflow and
    # non-convergence must be handled inside.
    rng = np.random.default_rng(3)
    lines = 2.0 + np.outer(U, [-0.1, 0.0, 0.3]) + 1e-3 * rng.standard_normal((5, 3))
    lines[:, 2] = 2.0 + 50.0 * U**8  # an absurd curve as well
    trajectories = lines[:, None, :]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        estimate = curve_slopes(U, trajectories, np.array([2.0]), HORIZON, PROBE_BUDGET)
    assert np.all(np.isfinite(estimate.slope_matrix))


def test_curve_predictor_from_probe_steps() -> None:
    predictor = PREDICTORS["curve"]
    checkpoints = np.array(probe_progress(PROBE_BUDGET, predictor.num_probe_evals))
    u = checkpoints / PROBE_BUDGET
    # Domain 1 is domain 0 shifted by +1: the same changes, so the same slopes.
    per_dataset = np.stack([curve(u) for curve in CURVES.values()], axis=-1)  # (K, N)
    trajectories = np.stack([per_dataset, per_dataset + 1.0], axis=1)  # (K, M, N)
    estimate = predictor.slopes(
        anchor=np.array([2.0, 3.0]),
        checkpoints=checkpoints,
        trajectories=trajectories,
        probe_budget=PROBE_BUDGET,
        horizon=HORIZON,
    )
    assert estimate.slope_matrix.shape == estimate.models.shape == estimate.guarded.shape == (2, 3)
    np.testing.assert_allclose(estimate.slope_matrix[0], estimate.slope_matrix[1], atol=1e-7)
    expected = [(curve(4.0) - curve(0.0)) / HORIZON for curve in CURVES.values()]
    np.testing.assert_allclose(estimate.slope_matrix[0], expected, atol=1e-4 / HORIZON)
    assert set(estimate.details) == {"slope_models", "extrapolation_guarded"}


def test_probe_progress_spread_evenly_and_end_at_the_budget() -> None:
    assert probe_progress(128, 5) == (26, 51, 77, 102, 128)
    assert probe_progress(128, 1) == (128,)
    assert probe_progress(1, 5) == (1,)


def test_aicc_is_undefined_without_enough_points() -> None:
    assert aicc(1.0, num_points=6, num_params=3) < np.inf
    assert aicc(1.0, num_points=5, num_params=3) == np.inf
    # A better fit lowers it; one more parameter at equal fit raises it.
    assert aicc(0.5, 6, 2) < aicc(1.0, 6, 2) < aicc(1.0, 6, 3)


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="probe_budget"):
        linear_slopes(np.zeros(2), np.zeros((2, 3)), 0)
    with pytest.raises(ValueError, match="increasing"):
        curve_slopes(np.array([0.5, 0.2]), np.zeros((2, 1, 1)), np.zeros(1), 8, 8)
    with pytest.raises(ValueError, match="u = 1"):
        PREDICTORS["linear"].fit(np.array([0.5]), np.zeros((1, 1, 1)), np.zeros(1), 8, 8)

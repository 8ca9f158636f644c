"""Fixed-weight baselines (section 4.4) and policy validation."""

from __future__ import annotations

import numpy as np
import pytest

from dynamics.core.fixed_mixtures import fixed_mixture_sweep
from dynamics.core.policies import FixedWeightsPolicy
from dynamics.data.scenarios import list_scenarios


def sweep_for(scenario):
    roles = ["target"] * scenario.n_T + ["non-target"] * (scenario.N - scenario.n_T)
    budgets = [d.budget for d in scenario.fine_tuning_datasets]
    return fixed_mixture_sweep(roles, budgets)


def test_uniform_and_proportional_schemes():
    sweep = fixed_mixture_sweep(
        ["target", "target", "non-target", "non-target"], [500, 1500, None, 100]
    )
    by_label = {m.label: np.array(m.weights) for m in sweep}
    np.testing.assert_allclose(by_label["uniform-w0.2"], [0.1, 0.1, 0.4, 0.4])
    np.testing.assert_allclose(by_label["proportional-w0.2"], [0.05, 0.15, 0.4, 0.4])
    np.testing.assert_allclose(by_label["uniform-w0"], [0, 0, 0.5, 0.5])
    # w = 0 gives the same mixture under both schemes: the proportional one is skipped.
    assert "proportional-w0" not in by_label
    assert len(sweep) == 9
    for m in sweep:
        assert abs(sum(m.weights) - 1.0) < 1e-12 and min(m.weights) >= 0


def test_duplicates_skipped_for_single_target_and_equal_budgets():
    assert len(fixed_mixture_sweep(["target", "non-target"], [300, None])) == 5
    assert len(fixed_mixture_sweep(["target", "target", "non-target"], [500, 500, None])) == 5


def test_every_paper_scenario_gets_5_to_9_baseline_runs():
    counts = {}
    for scenario in list_scenarios():
        if scenario.number > 50:
            continue
        sweep = sweep_for(scenario)
        counts[scenario.number] = len(sweep)
        weights = np.array([m.weights for m in sweep])
        # No two configurations are the same mixture.
        assert len({tuple(np.round(w, 12)) for w in weights}) == len(sweep)
    assert len(counts) == 50
    assert min(counts.values()) == 5 and max(counts.values()) == 9
    assert all(counts[n] == 5 for n in range(1, 11))  # single-target scenarios


def test_sweep_errors():
    with pytest.raises(ValueError, match="at least one target"):
        fixed_mixture_sweep(["non-target"], [None])
    with pytest.raises(ValueError, match="unknown dataset roles"):
        fixed_mixture_sweep(["target", "constraint"], [1, None])
    with pytest.raises(ValueError, match="outside"):
        fixed_mixture_sweep(["target", "non-target"], [1, None], target_masses=[1.5])


def test_fixed_weights_are_validated_and_normalised():
    assert np.allclose(FixedWeightsPolicy(np.array([2.0, 2.0]), total_steps=10).weights, [0.5, 0.5])
    with pytest.raises(ValueError, match="non-negative"):
        FixedWeightsPolicy(np.array([-1.0, 2.0]), total_steps=10)

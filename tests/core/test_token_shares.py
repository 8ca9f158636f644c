"""``training.sampling: tokens``: the solver's batch shares are what the run trains, and the
records' weights are those batch shares as token shares (:mod:`dynamics.core.shares`).

The toy learner draws each step's dataset as the sampler does under tokens, from datasets
whose batches hold 64, 256 and 128 tokens, so a policy that handed it its solved batch shares
as token shares would train another mixture than the one its predictions describe.
"""

from __future__ import annotations

import numpy as np
import pytest

from dynamics.core.controller import run_mixture_training
from dynamics.core.policies import DynamicsPolicy, FixedWeightsPolicy
from dynamics.core.records import RunHistory
from dynamics.core.schedules import build_schedule
from dynamics.core.shares import BatchShares, TokenShares
from tests.core.toy_learner import TokenToyLearner

TOKENS_PER_BATCH = (64.0, 256.0, 128.0)  # dataset 1's batches hold 4x dataset 0's tokens
# Per batch: dataset 0 teaches the target (e0) most and harms the constraint (e1), which
# datasets 1 and 2 repair, so the solver mixes datasets of different lengths.
SLOPES = np.array([[-6e-4, -2.5e-4, -1e-4], [3e-4, -1e-4, -2e-4]])
TOTAL_STEPS = 4000


def token_run(policy_of, seed: int = 0) -> tuple[RunHistory, TokenToyLearner]:
    learner = TokenToyLearner(SLOPES, np.array([3.0, 1.0]), TOKENS_PER_BATCH, seed=seed)
    history = run_mixture_training(
        learner,
        policy_of(learner.unit),
        targets=[0],
        constraints=[1],
        eval_interval=1000,
        reduced_batches=4,
    )
    return history, learner


def binomial_standard_errors(batch_shares: np.ndarray, horizon: int) -> np.ndarray:
    """Standard error of each domain's realized change over ``horizon`` steps whose datasets
    are drawn independently with ``batch_shares``: the multinomial counts' spread through
    the slopes, ``sqrt(H (sum_j b_j S_ij^2 - (sum_j b_j S_ij)^2))``."""
    mean = SLOPES @ batch_shares
    return np.sqrt(horizon * (SLOPES**2 @ batch_shares - mean**2))


def test_the_predicted_losses_are_the_losses_the_drawn_batches_realize() -> None:
    schedule = build_schedule([0, 2000], TOTAL_STEPS)
    history, _ = token_run(lambda unit: DynamicsPolicy(schedule, unit=unit))
    assert len(history.updates) == 2
    for update in history.updates:
        batch_shares = np.asarray(update.batch_shares, dtype=float)
        # The solver mixes a short and a long dataset: batch and token shares differ.
        assert np.count_nonzero(batch_shares > 0.05) >= 2
        assert np.abs(update.weights - batch_shares).max() > 0.1
        # The recorded weights are the token shares of the batch shares solved.
        assert update.weights == pytest.approx(
            TokenShares(np.array(TOKENS_PER_BATCH)).weights_of(batch_shares)
        )
        assert update.predicted_losses is not None and update.realized_losses is not None
        # The predictions are eq. 3.3 in batch shares: L + H S b.
        assert update.predicted_losses == pytest.approx(
            update.current_losses + update.horizon * SLOPES @ batch_shares, abs=1e-12
        )
        error = update.realized_losses - update.predicted_losses
        assert np.all(np.abs(error) <= 5 * binomial_standard_errors(batch_shares, update.horizon))


def test_fixed_weights_are_token_shares_and_the_run_trains_them() -> None:
    user = np.array([0.5, 0.3, 0.2])
    history, learner = token_run(lambda unit: FixedWeightsPolicy(user, TOTAL_STEPS, unit=unit))
    (update,) = history.updates
    assert update.weights == pytest.approx(user, abs=0)
    batch_shares = np.asarray(update.batch_shares, dtype=float)
    assert batch_shares == pytest.approx(learner.unit.batch_shares(user))
    # Realized token shares against the user's: the counts' multinomial spread carried to
    # token shares, tau_j = n_j t_j / sum_k n_k t_k, to first order (delta method).
    t = np.array(TOKENS_PER_BATCH)
    mean_tokens = batch_shares @ t
    gradient = (np.diag(t) - np.outer(user, t)) / mean_tokens  # d tau_j / d (n_k / N)
    covariance = (np.diag(batch_shares) - np.outer(batch_shares, batch_shares)) / TOTAL_STEPS
    standard_errors = np.sqrt(np.einsum("jk,kl,jl->j", gradient, covariance, gradient))
    realized = learner.trained_tokens / learner.trained_tokens.sum()
    assert np.all(np.abs(realized - user) <= 5 * standard_errors)


def test_min_weight_holds_the_batch_shares() -> None:
    schedule = build_schedule([0, 2000], TOTAL_STEPS)
    history, _ = token_run(lambda unit: DynamicsPolicy(schedule, unit=unit, min_weight=0.2))
    for update in history.updates:
        batch_shares = np.asarray(update.batch_shares, dtype=float)
        assert batch_shares.min() >= 0.2 - 1e-12
        assert update.solver["min_weight"] == 0.2
    # The long dataset's token share is above its floored batch share, the short one's below.
    assert any(u.weights[0] < u.batch_shares[0] for u in history.updates)


def test_batch_shares_and_token_shares_map_one_to_one() -> None:
    unit = TokenShares(np.array(TOKENS_PER_BATCH))
    batch_shares = np.array([0.5, 0.0, 0.5])
    tokens = unit.weights_of(batch_shares)
    assert tokens == pytest.approx([64 / 192, 0.0, 128 / 192], abs=1e-15)
    assert unit.batch_shares(tokens) == pytest.approx(batch_shares, abs=1e-15)
    assert BatchShares().batch_shares(batch_shares) == pytest.approx(batch_shares, abs=0)
    with pytest.raises(ValueError, match="every dataset needs tokens"):
        TokenShares(np.array([64.0, 0.0]))

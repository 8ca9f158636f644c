"""An analytic Learner: metric values move linearly (or along known curves) with the
number of steps trained on each dataset, so slopes and predictions are known exactly; with
``noise`` > 0 every evaluation also draws fresh noise of a known size, as a real one does."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dynamics.core.learner import DomainKind, Evaluation
from dynamics.core.shares import TokenShares


class ToyLearner:
    """L_i(theta) = L0_i + sum_j effect_ij(n_j) + offset_ib, where n_j is the (expected)
    number of steps trained on dataset j. ``effect`` defaults to the linear A_ij * n_j.

    Per-batch offsets differ between batches but are fixed, like real evaluation batches:
    a slope estimated on the same batches is exact, one mixing batch sets is not. ``noise``
    is the standard deviation of independent N(0, noise^2) draws added to every batch value
    at every evaluation (seeded), so two evaluations of the same state differ.
    """

    def __init__(
        self,
        slopes: np.ndarray,
        initial: np.ndarray,
        num_batches: int = 8,
        effect: Callable[[np.ndarray], np.ndarray] | None = None,
        seed: int = 0,
        noise: float = 0.0,
        kinds: Sequence[DomainKind] | None = None,
        dataset_names: Sequence[str] | None = None,
    ) -> None:
        self.slopes = np.asarray(slopes, dtype=float)
        self.initial = np.asarray(initial, dtype=float)
        m, n = self.slopes.shape
        rng = np.random.default_rng(seed)
        self.offsets = {
            "eval": rng.normal(0.0, 0.5, size=(m, num_batches)),
            "test": rng.normal(0.0, 0.5, size=(m, num_batches)),
        }
        self.effect = effect or (lambda steps: self.slopes @ steps)
        self.noise = noise
        self.noise_rng = np.random.default_rng(seed + 1)
        self.names = (
            list(dataset_names) if dataset_names is not None else [f"d{j}" for j in range(n)]
        )
        self.kinds = list(kinds) if kinds is not None else [DomainKind("loss", 4)] * m
        self.steps_per_dataset = np.zeros(n)
        self.trained_steps = 0
        self.evaluations: list[tuple[str, int]] = []

    @property
    def dataset_names(self) -> list[str]:
        return self.names

    @property
    def domain_names(self) -> list[str]:
        return [f"e{i}" for i in range(self.slopes.shape[0])]

    @property
    def domain_kinds(self) -> list[DomainKind]:
        return self.kinds

    def values(self) -> np.ndarray:
        return self.initial + self.effect(self.steps_per_dataset)

    def evaluate(self, split: str, num_batches: int | None = None) -> Evaluation:
        offsets = self.offsets[split]
        nb = offsets.shape[1] if num_batches is None else num_batches
        self.evaluations.append((split, nb))
        per_batch = self.values()[:, None] + offsets[:, :nb]
        if self.noise > 0:
            per_batch = per_batch + self.noise_rng.normal(0.0, self.noise, size=per_batch.shape)
        return Evaluation(per_batch)

    def train(self, steps: int, weights: np.ndarray) -> None:
        assert steps > 0
        self.steps_per_dataset = self.steps_per_dataset + steps * np.asarray(weights, dtype=float)
        self.trained_steps += steps

    def probe(self, steps: int, dataset: int) -> None:
        one_hot = np.zeros(self.slopes.shape[1])
        one_hot[dataset] = 1.0
        self.train(steps, one_hot)

    def snapshot(self) -> tuple[np.ndarray, int]:
        return self.steps_per_dataset.copy(), self.trained_steps

    def restore(self, snapshot: tuple[np.ndarray, int]) -> None:
        self.steps_per_dataset = snapshot[0].copy()
        self.trained_steps = snapshot[1]


class TokenToyLearner(ToyLearner):
    """A :class:`ToyLearner` whose datasets' batches hold different numbers of tokens
    (``tokens_per_batch[j]`` each) and whose training draws every step's dataset, as the
    sampler does under ``training.sampling: tokens``: with the batch shares
    ``unit.batch_shares(weights)`` of the token shares it is given. Each drawn batch moves
    the values by its dataset's column of ``slopes``, so a stretch realizes the draws it made."""

    def __init__(
        self,
        slopes: np.ndarray,
        initial: np.ndarray,
        tokens_per_batch: Sequence[float],
        seed: int = 0,
    ) -> None:
        super().__init__(slopes, initial, seed=seed)
        self.unit = TokenShares(np.asarray(tokens_per_batch, dtype=float))
        self.draw_rng = np.random.default_rng(seed + 2)

    @property
    def trained_tokens(self) -> np.ndarray:
        """The tokens trained on each dataset by the main run (probes are rolled back)."""
        return self.steps_per_dataset * self.unit.tokens_per_batch

    def train(self, steps: int, weights: np.ndarray) -> None:
        assert steps > 0
        num_datasets = self.slopes.shape[1]
        drawn = self.draw_rng.choice(num_datasets, size=steps, p=self.unit.batch_shares(weights))
        self.steps_per_dataset = self.steps_per_dataset + np.bincount(drawn, minlength=num_datasets)
        self.trained_steps += steps

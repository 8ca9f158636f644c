"""An analytic Learner: metric values move linearly (or along known curves) with the
number of steps trained on each dataset, so slopes and predictions are known exactly."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dynamics.core.learner import Evaluation


class ToyLearner:
    """L_i(theta) = L0_i + sum_j effect_ij(n_j) + offset_ib, where n_j is the (expected)
    number of steps trained on dataset j. ``effect`` defaults to the linear A_ij * n_j.

    Per-batch offsets differ between batches but are fixed, like real evaluation batches:
    a slope estimated on the same batches is exact, one mixing batch sets is not.
    """

    def __init__(
        self,
        slopes: np.ndarray,
        initial: np.ndarray,
        num_batches: int = 8,
        effect: Callable[[np.ndarray], np.ndarray] | None = None,
        seed: int = 0,
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
        self.steps_per_dataset = np.zeros(n)
        self.trained_steps = 0
        self.evaluations: list[tuple[str, int]] = []

    @property
    def dataset_names(self) -> list[str]:
        return [f"d{j}" for j in range(self.slopes.shape[1])]

    @property
    def domain_names(self) -> list[str]:
        return [f"e{i}" for i in range(self.slopes.shape[0])]

    def values(self) -> np.ndarray:
        return self.initial + self.effect(self.steps_per_dataset)

    def evaluate(self, split: str, num_batches: int | None = None) -> Evaluation:
        offsets = self.offsets[split]
        nb = offsets.shape[1] if num_batches is None else num_batches
        self.evaluations.append((split, nb))
        return Evaluation(self.values()[:, None] + offsets[:, :nb])

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

"""The mixture problem solved at each update (paper eqs. 3.1, 3.3, 3.4)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

# A predicted loss counts as satisfying its constraint up to this absolute tolerance,
# so that a solution sitting exactly on the boundary is not declared infeasible by
# floating-point noise.
FEASIBILITY_TOL = 1e-9


@dataclass(frozen=True)
class SolverGrid:
    """The (lambda, eps) grid of appendix G: lambda log-spaced over [1, 5000] (15 values),
    eps linear over [0, 0.1] (3 values): 45 candidates per update."""

    lambdas: tuple[float, ...] = tuple(float(x) for x in np.logspace(0.0, np.log10(5000.0), 15))
    epsilons: tuple[float, ...] = tuple(float(x) for x in np.linspace(0.0, 0.1, 3))

    def __post_init__(self) -> None:
        if not self.lambdas or any(not np.isfinite(x) or x <= 0 for x in self.lambdas):
            raise ValueError("grid.lambdas must be a non-empty list of positive numbers")
        if not self.epsilons or any(not np.isfinite(x) or x < 0 for x in self.epsilons):
            raise ValueError("grid.epsilons must be a non-empty list of numbers >= 0")


@dataclass(frozen=True)
class MixtureProblem:
    """Everything the solver needs at one update.

    slopes:            S(t), shape (M, N): metric change per training step on dataset j.
    current_losses:    L_i(theta_t), shape (M,).
    reference_losses:  L_i^ref, shape (M,); NaN for domains that are not constraints.
    targets:           indices of target domains T (at least one).
    constraints:       indices of constrained domains C (may be empty).
    horizon:           H_t, steps until the next update.
    min_weight:        m, the least weight of every dataset (0 <= m, N m <= 1): the feasible
                       mixtures are the simplex points with w >= m.

    With a floor, ``w = m 1 + (1 - N m) v`` maps the simplex of ``v`` one to one onto the
    mixtures with ``w >= m``, and eqs. 3.3-3.4 in ``v`` are the same problem with slopes
    ``(1 - N m) S`` and current losses ``L + H_t m S 1`` (:meth:`above_floor`): predictions
    and violations are equal, the target objective differs by the constant ``m g.1``. The
    solvers solve that problem on the simplex and map back (:meth:`floored`).
    """

    slopes: np.ndarray
    current_losses: np.ndarray
    reference_losses: np.ndarray
    targets: tuple[int, ...]
    constraints: tuple[int, ...]
    horizon: float
    grid: SolverGrid = field(default_factory=SolverGrid)
    min_weight: float = 0.0

    def __post_init__(self) -> None:
        slopes = np.asarray(self.slopes, dtype=float)
        object.__setattr__(self, "slopes", slopes)
        object.__setattr__(self, "current_losses", np.asarray(self.current_losses, dtype=float))
        object.__setattr__(self, "reference_losses", np.asarray(self.reference_losses, dtype=float))
        object.__setattr__(self, "targets", tuple(int(i) for i in self.targets))
        object.__setattr__(self, "constraints", tuple(int(i) for i in self.constraints))
        if slopes.ndim != 2 or slopes.shape[0] == 0 or slopes.shape[1] == 0:
            raise ValueError(
                f"slopes must be an M x N matrix with M, N >= 1, got shape {slopes.shape}"
            )
        m = slopes.shape[0]
        if self.current_losses.shape != (m,):
            raise ValueError(
                f"current_losses must have length M={m}, got {self.current_losses.shape}"
            )
        if self.reference_losses.shape != (m,):
            raise ValueError(
                f"reference_losses must have length M={m}, got {self.reference_losses.shape}"
            )
        if not np.all(np.isfinite(slopes)):
            raise ValueError("slopes must be finite numbers")
        if not np.all(np.isfinite(self.current_losses)):
            raise ValueError("current_losses must be finite numbers")
        if not self.targets:
            raise ValueError("targets must name at least one evaluation domain")
        for name, idx in (("targets", self.targets), ("constraints", self.constraints)):
            bad = [i for i in idx if not 0 <= i < m]
            if bad:
                raise ValueError(f"{name} has indices {bad} outside [0, {m - 1}]")
            if len(set(idx)) != len(idx):
                raise ValueError(f"{name} has repeated indices")
        if set(self.targets) & set(self.constraints):
            raise ValueError("a domain cannot be both a target and a constraint")
        if not np.all(np.isfinite(self.reference_losses[list(self.constraints)])):
            raise ValueError("reference_losses must be finite for every constrained domain")
        if not np.isfinite(self.horizon) or self.horizon <= 0:
            raise ValueError(f"horizon must be a positive number, got {self.horizon}")
        m, n = self.min_weight, slopes.shape[1]
        if not np.isfinite(m) or m < 0 or n * m > 1.0 + 1e-12:
            raise ValueError(f"min_weight must be >= 0 with N * min_weight <= 1 (N = {n}), got {m}")

    @property
    def num_datasets(self) -> int:
        return int(self.slopes.shape[1])

    @property
    def free_mass(self) -> float:
        """1 - N m: the weight the solver distributes above the floor."""
        return max(0.0, 1.0 - self.num_datasets * self.min_weight)

    def above_floor(self) -> MixtureProblem:
        """The problem in ``v`` (see the class doc), without a floor; itself when m = 0."""
        m = self.min_weight
        if m == 0:
            return self
        return replace(
            self,
            slopes=self.free_mass * self.slopes,
            current_losses=self.current_losses + self.horizon * m * self.slopes.sum(axis=1),
            min_weight=0.0,
        )

    def floored(self, v: np.ndarray) -> np.ndarray:
        """The mixture ``w = m 1 + (1 - N m) v`` of a simplex point ``v`` of :meth:`above_floor`."""
        v = np.asarray(v, dtype=float)
        if self.min_weight == 0:
            return v
        return self.min_weight + self.free_mass * v

    def unfloored(self, w: np.ndarray) -> np.ndarray:
        """The ``v`` of a mixture ``w >= m`` (uniform when N m = 1, where every v gives the
        same w)."""
        w = np.asarray(w, dtype=float)
        if self.min_weight == 0:
            return w
        if self.free_mass == 0:
            return np.full(w.shape, 1.0 / w.size)
        return (w - self.min_weight) / self.free_mass

    def predicted_losses(self, weights: Sequence[float] | np.ndarray) -> np.ndarray:
        """Eq. 3.3: L_hat_i(w) = L_i(theta_t) + H_t * S_i . w."""
        return self.current_losses + self.horizon * (self.slopes @ np.asarray(weights, dtype=float))

    def target_objective(self, weights: Sequence[float] | np.ndarray) -> float:
        """The linear target objective of eq. 3.4: sum_{i in T} S_i . w."""
        return float(self.slopes[list(self.targets)].sum(axis=0) @ np.asarray(weights, dtype=float))

    def violations(self, weights: Sequence[float] | np.ndarray) -> np.ndarray:
        """L_hat_i(w) - L_i^ref for each constrained domain (positive = violated)."""
        c = list(self.constraints)
        return self.predicted_losses(weights)[c] - self.reference_losses[c]

    def max_violation(self, weights: Sequence[float] | np.ndarray) -> float:
        """Largest constraint violation, 0 when every constraint holds (or none exist)."""
        v = self.violations(weights)
        return float(max(0.0, v.max())) if v.size else 0.0


def to_simplex(w: np.ndarray) -> np.ndarray:
    """Clip the tiny negatives a numerical solver leaves and renormalise to sum 1."""
    w = np.clip(np.asarray(w, dtype=float), 0.0, None)
    total = w.sum()
    if not np.isfinite(total) or total <= 0:
        return np.full(w.shape, 1.0 / w.size)
    return w / total


def to_floored_simplex(w: np.ndarray, min_weight: float | np.ndarray) -> np.ndarray:
    """:func:`to_simplex` for mixtures with every weight >= ``min_weight`` (one floor for all,
    or one per weight): what a solver leaves below its floor is clipped to it and the weight
    above the floors renormalised to one minus their sum. Exactly :func:`to_simplex` when
    every floor is 0."""
    w = np.asarray(w, dtype=float)
    if np.ndim(min_weight) == 0:
        if min_weight == 0:
            return to_simplex(w)
        return min_weight + max(0.0, 1.0 - w.size * min_weight) * to_simplex(w - min_weight)
    floors = np.asarray(min_weight, dtype=float)
    if not np.any(floors):
        return to_simplex(w)
    return floors + max(0.0, 1.0 - float(floors.sum())) * to_simplex(w - floors)


SELECTION_TIE = 1e-12
"""Relative difference below which two candidates' objectives (or violations) count as
equal: differences that small are the solvers' rounding, which moves between machines."""

T = TypeVar("T")


def lowest_up_to_rounding(items: Sequence[T], value: Callable[[T], float]) -> list[T]:
    """The items whose ``value`` is the lowest up to :data:`SELECTION_TIE`, in their order."""
    best = min(value(item) for item in items)
    return [item for item in items if value(item) <= best + SELECTION_TIE * max(1.0, abs(best))]

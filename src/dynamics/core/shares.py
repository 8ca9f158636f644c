"""What a mixture's weights are shares of: batches or trained tokens (``training.sampling``).

The slopes ``S_ij`` are changes per batch (optimizer step) of dataset ``j``, so the
predictions ``L + H S b`` of eqs. 3.3-3.4 hold for *batch shares* ``b``: the fraction of
the ``H`` steps drawn from each dataset. The solvers therefore always work in batch shares,
and so do the floors they hold (``min_weight``, ``target_floor``) and the
mixture a policy learns from. The weights a user writes (``method.weights``) and reads (the
records' ``weights``) are in the run's unit:

- :class:`BatchShares`: the weights are the batch shares themselves.
- :class:`TokenShares`: the weights are shares of the trained tokens. With ``t_j`` the mean
  non-padding tokens of a batch of dataset ``j``, token shares ``tau`` and batch shares ``b``
  map one to one: ``b_j = (tau_j / t_j) / sum_k tau_k / t_k`` and
  ``tau_j = b_j t_j / sum_k b_k t_k`` (zeros stay zeros).

The sampler draws each batch with the batch shares of the weights it is given, so a policy
that solved batch shares ``b`` and records ``weights_of(b)`` trains exactly ``b``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike


class MixtureUnit(Protocol):
    """The unit of the weights a user writes and reads, and its map to batch shares."""

    @property
    def name(self) -> str:
        """``training.sampling``'s value: "batches" or "tokens"."""
        ...

    def batch_shares(self, weights: ArrayLike) -> np.ndarray:
        """The batch shares a mixture of these ``weights`` trains (sums to 1)."""
        ...

    def weights_of(self, batch_shares: ArrayLike) -> np.ndarray:
        """The weights, in this unit, of a mixture with these ``batch_shares``."""
        ...


class BatchShares:
    """Weights that are batch shares (``training.sampling: batches``): nothing to convert."""

    name = "batches"

    def batch_shares(self, weights: ArrayLike) -> np.ndarray:
        return np.asarray(weights, dtype=float)

    def weights_of(self, batch_shares: ArrayLike) -> np.ndarray:
        return np.asarray(batch_shares, dtype=float)


@dataclass(frozen=True, eq=False)  # an array field: compared by identity
class TokenShares:
    """Weights that are shares of trained tokens (``training.sampling: tokens``);
    ``tokens_per_batch[j]`` is ``t_j``, dataset ``j``'s mean non-padding tokens per batch."""

    tokens_per_batch: np.ndarray
    name = "tokens"

    def __post_init__(self) -> None:
        t = np.asarray(self.tokens_per_batch, dtype=float)
        if t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)) or not np.all(t > 0):
            raise ValueError(
                f"every dataset needs tokens to sample by tokens, got tokens per batch {t}"
            )
        object.__setattr__(self, "tokens_per_batch", t)

    def batch_shares(self, weights: ArrayLike) -> np.ndarray:
        return _normalised(
            np.clip(np.asarray(weights, dtype=float), 0.0, None) / self.tokens_per_batch
        )

    def weights_of(self, batch_shares: ArrayLike) -> np.ndarray:
        return _normalised(
            np.clip(np.asarray(batch_shares, dtype=float), 0.0, None) * self.tokens_per_batch
        )


def _normalised(values: np.ndarray) -> np.ndarray:
    total = float(values.sum())
    if values.shape == (0,) or not total > 0:
        raise ValueError(f"a mixture needs some positive weight, got {values}")
    return values / total

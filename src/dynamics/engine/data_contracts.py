"""How data reaches the learner: training batches through a :class:`BatchSampler`, fixed
evaluation batches through an :class:`EvaluationDomain` (built by ``dynamics.data`` and
``dynamics.engine.sampler``).

Public API:

- ``Batch``: a batch of right-padded sequences, as a mapping of tensors.
- ``BatchSampler`` / ``SlicingSampler``: draw training and probe batches from the weighted
  mixture of the N fine-tuning datasets (``SlicingSampler`` also hands every rank's slice
  of a global probe batch to one process).
- ``EvaluationDomain``: an evaluation domain with its fixed eval and test batches.
- ``check_domains(domains)``: raise ValueError unless the domains form an (M, B) evaluation.
- ``split_batches(domain, split)``: a domain's ``"eval"`` or ``"test"`` batches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from torch import Tensor

Batch = Mapping[str, Tensor]
"""A batch of right-padded sequences.

Training and loss domains: ``input_ids``, ``attention_mask`` and ``labels`` (B, T), with
label -100 on tokens that carry no loss (blocks packed per document: ``position_ids``
instead of ``attention_mask``). Accuracy domains: ``input_ids`` and
``attention_mask`` (B, T) of the prompt ending right before the answer letter,
``choice_token_ids`` (B, K) and ``answer_index`` (B,).
"""


class BatchSampler(Protocol):
    """Draws training batches from the weighted mixture of the N fine-tuning datasets."""

    def next_batch(self, weights: np.ndarray) -> tuple[int, Batch]:
        """One batch, from dataset j with probability ``weights[j]``; returns (j, batch)."""
        ...

    def probe_batch(self, dataset: int) -> Batch:
        """The next batch of dataset ``dataset``'s own probe stream (main order untouched)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Main streams and choice RNG under ``"streams"``/``"choice_rng"``, probe streams
        under ``"probe_streams"``."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class SlicingSampler(BatchSampler, Protocol):
    """A sampler of one rank's slice of each global batch, which can also hand a rank that
    probes on its own every rank's slice (``HFLearner.probe_all``)."""

    def probe_slices(self, dataset: int) -> list[Batch]:
        """The next global probe batch of ``dataset``, as the list of every rank's slice."""
        ...


class EvaluationDomain(Protocol):
    """An evaluation domain E_i with its fixed evaluation and test batches."""

    @property
    def name(self) -> str: ...

    @property
    def metric(self) -> Literal["loss", "accuracy"]: ...

    @property
    def eval_batches(self) -> Sequence[Batch]: ...

    @property
    def test_batches(self) -> Sequence[Batch]: ...


def split_batches(domain: EvaluationDomain, split: str) -> Sequence[Batch]:
    """``domain``'s fixed batches of ``split`` (``"eval"`` or ``"test"``)."""
    if split == "eval":
        return domain.eval_batches
    if split == "test":
        return domain.test_batches
    raise ValueError(f"split must be 'eval' or 'test', got {split!r}")


def check_domains(domains: Sequence[EvaluationDomain]) -> None:
    """Raise ValueError unless there is at least one domain, every domain holds the same
    number (>= 1) of eval batches and of test batches, and each metric is known."""
    if not domains:
        raise ValueError("domains is empty: the learner needs at least one evaluation domain")
    for split in ("eval", "test"):
        counts = {
            domain.name: len(domain.eval_batches if split == "eval" else domain.test_batches)
            for domain in domains
        }
        if min(counts.values()) < 1 or len(set(counts.values())) > 1:
            raise ValueError(
                f"every domain needs the same number (>= 1) of {split} batches, got {counts}; "
                "the data layer should repeat the batches of small domains"
            )
    for domain in domains:
        if domain.metric not in ("loss", "accuracy"):
            raise ValueError(
                f"domain {domain.name!r}: metric must be 'loss' or 'accuracy', "
                f"got {domain.metric!r}"
            )

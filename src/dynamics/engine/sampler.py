"""The weighted mixture sampler: which fine-tuning dataset each training batch comes from.

Public API:

- ``DatasetStream(examples, *, batch_size, pad_id, seed)``: the endless batches of one
  dataset. It walks a seeded permutation of the examples and starts a fresh seeded
  permutation at every epoch, so a small (budgeted) dataset repeats over epochs in a new
  order each time and an unlimited one (no budget) is never exhausted: if it is finite on
  disk it simply cycles the same way. A batch that crosses an epoch boundary takes the end
  of one epoch and the start of the next. ``next_batch()`` returns a ``collate_lm`` batch.
- ``MixtureSampler(streams, seed, sampling="batches")``: ``next_batch(weights) -> (j, batch)``
  draws one dataset ``j`` with probability ``weights[j]`` and returns the next batch of its
  stream: a whole batch comes from one dataset, as in the paper ("a batch is drawn from D_j
  with proportion w_j"). With ``sampling="tokens"`` the weights are shares of trained tokens
  instead: ``j`` is drawn with probability proportional to ``weights[j] / t_j``, where
  ``t_j`` is the stream's mean non-padding tokens per batch (``mean_tokens_per_batch``), so
  a dataset of shorter rows is drawn more often and over the run each dataset's share of
  the tokens trained on approaches its weight. ``unit`` is that map between the weights and
  the batch shares drawn (:mod:`dynamics.core.shares`), the one a policy must record its
  solved batch shares through. ``probe_batch(j)`` returns the next batch of dataset ``j``'s *probe
  stream*, a second stream over the same examples with its own order and position, so
  probing (slope estimation, gradient alignment) never changes the main run's data order.
- ``state_dict()`` / ``load_state_dict()`` on both: the run state of the data order
  (per-stream seed, epoch and position; the choice generator's state), plain Python ints,
  strings, lists and dicts, exact on a round trip, and cheap: no example is copied, the
  epoch's permutation is recomputed from ``(seed, epoch)``.

Examples are tokenized before they reach a stream (``dynamics.data.build_examples``), and
the weights are an argument of every draw, so a new mixture never re-tokenizes anything.

Probe streams are meant to keep advancing from one update to the next, so successive probes
of a dataset see fresh batches: a learner that probes with ``probe_batch`` need not snapshot
this sampler at all (probing leaves the main streams and the choice generator untouched).
If it restores a full ``state_dict()`` after each probe, the probe streams roll back too and
every update probes dataset j on the same batches. ``state_dict()`` holds both kinds of
streams so that a resumed run continues exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from dynamics.core.shares import BatchShares, MixtureUnit, TokenShares
from dynamics.data.formatting import LMExample
from dynamics.engine.batches import Batch, collate_lm

# Mixed into a main stream's seed to seed its probe stream (any fixed constant would do).
_PROBE_SALT = 0x5EED_9B0B


class DatasetStream:
    """Endless seeded batches of one dataset's training examples (see the module doc)."""

    def __init__(
        self, examples: Sequence[LMExample], *, batch_size: int, pad_id: int, seed: int
    ) -> None:
        if not examples:
            raise ValueError("a DatasetStream needs at least one example")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be >= 1")
        if seed < 0:
            raise ValueError(f"seed={seed}: must be >= 0")
        self._examples = examples  # shared, never copied
        self.batch_size = batch_size
        self.pad_id = pad_id
        self.seed = seed
        self._epoch = 0
        self._position = 0
        self._order = self._permutation(0)

    @property
    def num_examples(self) -> int:
        return len(self._examples)

    @property
    def epoch(self) -> int:
        """Completed passes over the examples (0 during the first)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Examples of the current epoch's order already taken."""
        return self._position

    @property
    def mean_tokens_per_batch(self) -> float:
        """Non-padding tokens of a batch, on average over the run: ``batch_size`` times the
        mean length of the examples (padding is added only when a batch is collated). Exact
        for the stream in the long run, since every epoch takes each example once; computed
        from the examples, so reading it moves nothing."""
        return self.batch_size * float(np.mean([len(example) for example in self._examples]))

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)

    def next_indices(self) -> list[int]:
        """Indices of the next ``batch_size`` examples, crossing epochs when needed."""
        taken: list[int] = []
        while len(taken) < self.batch_size:
            if self._position == self.num_examples:
                self._epoch += 1
                self._position = 0
                self._order = self._permutation(self._epoch)
            count = min(self.batch_size - len(taken), self.num_examples - self._position)
            taken.extend(int(i) for i in self._order[self._position : self._position + count])
            self._position += count
        return taken

    def next_batch(self) -> Batch:
        """The next batch, collated by ``collate_lm``."""
        return collate_lm([self._examples[i] for i in self.next_indices()], self.pad_id)

    def probe_stream(self) -> DatasetStream:
        """A new stream over the same examples with a seed derived from this one's."""
        seed = int(np.random.SeedSequence([self.seed, _PROBE_SALT]).generate_state(1)[0])
        return DatasetStream(
            self._examples, batch_size=self.batch_size, pad_id=self.pad_id, seed=seed
        )

    def state_dict(self) -> dict[str, int]:
        return {
            "seed": self.seed,
            "num_examples": self.num_examples,
            "epoch": self._epoch,
            "position": self._position,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["seed"] != self.seed or state["num_examples"] != self.num_examples:
            raise ValueError(
                f"stream state saved for seed {state['seed']} and {state['num_examples']} "
                f"examples cannot be loaded into a stream with seed {self.seed} and "
                f"{self.num_examples} examples: the data or the seed changed since it was saved"
            )
        if not 0 <= state["position"] <= self.num_examples or state["epoch"] < 0:
            raise ValueError(f"invalid stream state {state}")
        if state["epoch"] != self._epoch:
            self._order = self._permutation(state["epoch"])
        self._epoch = state["epoch"]
        self._position = state["position"]


class MixtureSampler:
    """Draws each training batch's dataset from the mixture weights (see the module doc)."""

    def __init__(
        self, streams: Sequence[DatasetStream], seed: int, sampling: str = "batches"
    ) -> None:
        if not streams:
            raise ValueError("a MixtureSampler needs at least one dataset stream")
        if sampling not in ("batches", "tokens"):
            raise ValueError(f"sampling={sampling!r}: use 'batches' or 'tokens'")
        self.streams = list(streams)
        self.probe_streams = [stream.probe_stream() for stream in self.streams]
        self._choice_rng = np.random.Generator(np.random.PCG64(seed))
        self.sampling = sampling
        # Tokens: each weight is divided by its dataset's mean tokens per batch, measured once.
        self.unit: MixtureUnit = (
            TokenShares(np.array([stream.mean_tokens_per_batch for stream in self.streams]))
            if sampling == "tokens"
            else BatchShares()
        )

    @property
    def num_datasets(self) -> int:
        return len(self.streams)

    def _cumulative(self, weights: ArrayLike) -> np.ndarray:
        w = np.asarray(weights, dtype=float)
        if w.shape != (self.num_datasets,) or not np.isfinite(w).all():
            raise ValueError(f"weights {w} must be {self.num_datasets} finite numbers")
        # Solvers return -1e-17 for an exact zero; anything clearly negative is a bug.
        if (w < -1e-9).any() or abs(w.sum() - 1.0) > 1e-6:
            raise ValueError(f"weights {w} must be non-negative and sum to 1")
        shares = self.unit.batch_shares(np.clip(w, 0.0, None))
        cumulative = np.cumsum(shares)
        # Dividing by the total makes the last non-zero entry exactly 1.0, so a uniform
        # draw in [0, 1) can never land on a zero-weight dataset.
        return cumulative / cumulative[-1]

    def draw_dataset(self, weights: ArrayLike) -> int:
        """Index j drawn with probability ``weights[j]``, or by tokens proportional to
        ``weights[j] / t_j`` (one uniform draw of the choice RNG either way)."""
        cumulative = self._cumulative(weights)
        return int(np.searchsorted(cumulative, self._choice_rng.random(), side="right"))

    def next_batch(self, weights: ArrayLike) -> tuple[int, Batch]:
        """Draw a dataset with ``weights`` and return it with its stream's next batch."""
        j = self.draw_dataset(weights)
        return j, self.streams[j].next_batch()

    def probe_batch(self, j: int) -> Batch:
        """The next batch of dataset ``j``'s probe stream; the main order is untouched."""
        return self.probe_streams[j].next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "choice_rng": copy.deepcopy(self._choice_rng.bit_generator.state),
            "streams": [stream.state_dict() for stream in self.streams],
            "probe_streams": [stream.state_dict() for stream in self.probe_streams],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (
            len(state["streams"]) != self.num_datasets
            or len(state["probe_streams"]) != self.num_datasets
        ):
            raise ValueError(
                f"sampler state of {len(state['streams'])} datasets cannot be loaded into a "
                f"sampler of {self.num_datasets}"
            )
        for stream, stream_state in zip(self.streams, state["streams"], strict=True):
            stream.load_state_dict(stream_state)
        for stream, stream_state in zip(self.probe_streams, state["probe_streams"], strict=True):
            stream.load_state_dict(stream_state)
        self._choice_rng.bit_generator.state = copy.deepcopy(state["choice_rng"])

"""The mixture sampler: per-dataset streams, weighted draws, state, probe streams."""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Any

import datasets
import numpy as np
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from dynamics.data import DataSource, LMExample, build_examples
from dynamics.engine.batches import Batch
from dynamics.engine.sampler import DatasetStream, MixtureSampler
from tests.fixtures.tiny_tokenizer import tiny_tokenizer

PAD = 0


def pool(n: int, tag: int) -> list[LMExample]:
    """Examples whose first token identifies them: ``tag * 1000 + index``."""
    return [
        LMExample(
            input_ids=np.asarray([tag * 1000 + i, 1], dtype=np.int32),
            labels=np.asarray([tag * 1000 + i, 1], dtype=np.int32),
        )
        for i in range(n)
    ]


def ids(batch: Batch) -> list[int]:
    return batch["input_ids"][:, 0].tolist()


def stream(n: int, tag: int = 0, batch_size: int = 4, seed: int = 0) -> DatasetStream:
    return DatasetStream(pool(n, tag), batch_size=batch_size, pad_id=PAD, seed=seed)


def sampler(seed: int = 0) -> MixtureSampler:
    return MixtureSampler(
        [stream(12, 0, seed=10), stream(7, 1, seed=11), stream(30, 2, seed=12)], seed=seed
    )


def test_each_epoch_is_a_fresh_permutation() -> None:
    s = stream(12, batch_size=4)
    epochs = [[i for _ in range(3) for i in ids(s.next_batch())] for _ in range(3)]
    assert all(sorted(e) == list(range(12)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    assert s.epoch == 2 and s.position == 12
    again = stream(12, batch_size=4)
    assert [i for _ in range(3) for i in ids(again.next_batch())] == epochs[0]


def test_batches_cross_epochs_and_tiny_datasets_repeat() -> None:
    s = stream(5, batch_size=2)
    taken = [i for _ in range(5) for i in ids(s.next_batch())]  # 10 = two epochs
    assert sorted(taken[:5]) == sorted(taken[5:]) == list(range(5))
    tiny = stream(3, batch_size=8)
    batch = ids(tiny.next_batch())
    assert len(batch) == 8
    assert sorted(batch[:3]) == sorted(batch[3:6]) == [0, 1, 2]  # two whole epochs, then a third
    assert tiny.epoch == 2 and tiny.position == 2


def test_draw_frequencies_follow_the_weights() -> None:
    s = sampler(seed=123)
    weights = np.array([0.2, 0.5, 0.3])
    draws = Counter(s.next_batch(weights)[0] for _ in range(4000))
    frequencies = np.array([draws[j] for j in range(3)]) / 4000
    # Binomial standard deviation is at most 0.008 here: 0.03 is almost four of them.
    assert np.abs(frequencies - weights).max() < 0.03


def test_zero_weight_datasets_are_never_drawn() -> None:
    s = sampler()
    assert {s.next_batch([0.0, 1.0, 0.0])[0] for _ in range(200)} == {1}
    assert {s.draw_dataset([0.5, 0.5, 0.0]) for _ in range(200)} == {0, 1}
    assert s.draw_dataset([1 - 1e-12, -1e-17, 1e-12]) in (0, 2)


@pytest.mark.parametrize(
    "weights", [[0.5, 0.5], [0.5, 0.6, -0.1], [0.2, 0.2, 0.2], [np.nan, 0.5, 0.5]]
)
def test_invalid_weights(weights: list[float]) -> None:
    with pytest.raises(ValueError, match="weights"):
        sampler().next_batch(weights)


def test_whole_batch_comes_from_the_drawn_dataset() -> None:
    s = sampler()
    for _ in range(30):
        j, batch = s.next_batch([0.3, 0.3, 0.4])
        assert {i // 1000 for i in ids(batch)} == {j}


def test_changing_weights_never_retokenizes(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = tiny_tokenizer()
    calls = Counter[str]()
    original = PreTrainedTokenizerFast.__call__

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["tokenize"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerFast, "__call__", counting)
    rows = datasets.Dataset.from_list([{"text": f"document number {i}"} for i in range(10)])
    examples = build_examples(rows, tokenizer, DataSource(path="x.txt"), sequence_length=16)
    assert all(isinstance(e, LMExample) for e in examples)
    after_tokenizing = calls["tokenize"]
    assert after_tokenizing > 0
    s = MixtureSampler(
        [DatasetStream(examples, batch_size=2, pad_id=PAD, seed=0), stream(5, 1, batch_size=2)],  # type: ignore[arg-type]
        seed=0,
    )
    for weights in ([1.0, 0.0], [0.5, 0.5], [0.1, 0.9]):
        for _ in range(10):
            s.next_batch(weights)
    assert calls["tokenize"] == after_tokenizing


def run(s: MixtureSampler, steps: int) -> list[tuple[int, list[int]]]:
    rng = np.random.default_rng(5)
    out = []
    for _ in range(steps):
        weights = rng.dirichlet(np.ones(3))  # a new mixture every step
        j, batch = s.next_batch(weights)
        out.append((j, ids(batch)))
    return out


def test_state_round_trip_reproduces_the_future_batches() -> None:
    s = sampler()
    run(s, 17)
    s.probe_batch(1)
    state = s.state_dict()
    saved = json.loads(json.dumps(state))  # plain Python values: JSON-safe and exact
    assert saved == state
    future = run(s, 40)
    probe_future = [ids(s.probe_batch(j)) for j in range(3)]

    s.load_state_dict(saved)
    assert run(s, 40) == future
    assert [ids(s.probe_batch(j)) for j in range(3)] == probe_future

    fresh = sampler()
    fresh.load_state_dict(copy.deepcopy(state))
    assert run(fresh, 40) == future


def test_probe_streams_do_not_change_the_main_order() -> None:
    plain, probed = sampler(), sampler()
    expected = run(plain, 30)
    rng = np.random.default_rng(5)
    observed = []
    for step in range(30):
        if step % 7 == 0:
            for j in range(3):
                for _ in range(5):
                    probed.probe_batch(j)
        j, batch = probed.next_batch(rng.dirichlet(np.ones(3)))
        observed.append((j, ids(batch)))
    assert observed == expected
    # A probe stream has its own order over the same examples.
    probe = sampler().probe_streams[0]
    main = sampler().streams[0]
    assert ids(probe.next_batch()) != ids(main.next_batch())


def test_state_for_other_data_is_refused() -> None:
    state = sampler().state_dict()
    other = MixtureSampler(
        [stream(12, 0, seed=10), stream(8, 1, seed=11), stream(30, 2, seed=12)], seed=0
    )
    with pytest.raises(ValueError, match="the data or the seed changed"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="sampler state of 3 datasets"):
        MixtureSampler([stream(12, 0, seed=10)], seed=0).load_state_dict(state)


def test_batch_tensors() -> None:
    _, batch = sampler().next_batch([1 / 3] * 3)
    assert batch["input_ids"].shape == (4, 2) and batch["input_ids"].dtype == torch.long


# ------------------------------------------------------------- sampling by tokens


def varied_pool(n: int, tag: int, lengths: tuple[int, int], seed: int) -> list[LMExample]:
    """Examples of ``tag`` whose lengths are drawn uniformly from ``lengths`` (inclusive)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        row = np.full(int(rng.integers(lengths[0], lengths[1] + 1)), 1, dtype=np.int32)
        row[0] = tag * 1000 + i
        out.append(LMExample(input_ids=row, labels=row.copy()))
    return out


def token_sampler(sampling: str, seed: int = 0) -> MixtureSampler:
    pools = [
        varied_pool(40, 0, (2, 6), 1),
        varied_pool(25, 1, (10, 30), 2),
        varied_pool(60, 2, (1, 3), 3),
    ]
    streams = [DatasetStream(p, batch_size=4, pad_id=PAD, seed=20 + j) for j, p in enumerate(pools)]
    return MixtureSampler(streams, seed=seed, sampling=sampling)


def token_shares(
    s: MixtureSampler, weights: np.ndarray, draws: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each dataset's share of the non-padding tokens and of the batches drawn."""
    tokens, batches = np.zeros(3), np.zeros(3)
    for _ in range(draws):
        j, batch = s.next_batch(weights)
        tokens[j] += int(batch["attention_mask"].sum())
        batches[j] += 1
    return tokens / tokens.sum(), batches / draws


def test_mean_tokens_per_batch_is_the_batch_size_times_the_mean_example_length() -> None:
    examples = varied_pool(25, 1, (10, 30), 2)
    s = DatasetStream(examples, batch_size=4, pad_id=PAD, seed=0)
    assert s.mean_tokens_per_batch == pytest.approx(
        4 * np.mean([len(e) for e in examples]), rel=1e-12
    )
    assert s.state_dict() == DatasetStream(examples, batch_size=4, pad_id=PAD, seed=0).state_dict()


def test_by_tokens_each_dataset_gets_its_weight_of_the_tokens() -> None:
    weights = np.array([0.2, 0.5, 0.3])
    draws = 40_000
    tokens, batches = token_shares(token_sampler("tokens", seed=7), weights, draws)
    # Over 12 seeds the token shares' standard deviation was at most 0.0037 (dataset 1: few
    # batches of widely varying length); 0.02 is more than five of them.
    assert np.abs(tokens - weights).max() < 0.02
    # The datasets of short rows (0 and 2) are drawn far more often than their weight.
    assert batches[2] > 0.6 and batches[1] < 0.15
    # By batches, the same weights give the long rows of dataset 1 most of the tokens.
    by_batches, drawn = token_shares(token_sampler("batches", seed=7), weights, 6000)
    assert np.abs(drawn - weights).max() < 0.03  # binomial sd at most 0.0065
    assert by_batches[1] > 0.8


def test_by_tokens_a_zero_weight_is_never_drawn_and_the_state_round_trips() -> None:
    s = token_sampler("tokens")
    assert {s.draw_dataset([0.0, 1.0, 0.0]) for _ in range(100)} == {1}
    mixtures = np.random.default_rng(5).dirichlet(np.ones(3), size=43)
    for w in mixtures[:13]:
        s.next_batch(w)
    state = json.loads(json.dumps(s.state_dict()))
    future = [(j, ids(b)) for j, b in (s.next_batch(w) for w in mixtures[13:])]
    fresh = token_sampler("tokens")
    fresh.load_state_dict(state)
    assert [(j, ids(b)) for j, b in (fresh.next_batch(w) for w in mixtures[13:])] == future


def fixed_length_pool(n: int, tag: int, length: int) -> list[LMExample]:
    """``n`` examples of ``tag``, each ``length`` tokens long."""
    return [
        LMExample(
            input_ids=np.full(length, tag * 1000 + i, dtype=np.int32),
            labels=np.full(length, 1, dtype=np.int32),
        )
        for i in range(n)
    ]


def test_by_tokens_the_draws_train_the_solved_batch_shares_and_the_recorded_token_shares() -> None:
    # Rows of 3, 12 and 6 tokens: a batch of dataset 1 holds 4x the tokens of one of dataset 0.
    streams = [
        DatasetStream(fixed_length_pool(9, j, length), batch_size=2, pad_id=PAD, seed=30 + j)
        for j, length in enumerate((3, 12, 6))
    ]
    s = MixtureSampler(streams, seed=11, sampling="tokens")
    t = np.array([6.0, 24.0, 12.0])
    assert s.unit.tokens_per_batch == pytest.approx(t, abs=0)
    solved = np.array([0.3, 0.5, 0.2])  # the batch shares a solver's predictions assume
    recorded = s.unit.weights_of(solved)  # the token shares a record holds and the sampler is given
    assert recorded == pytest.approx(solved * t / (solved @ t))
    draws = 12_000
    batches, tokens = np.zeros(3), np.zeros(3)
    for _ in range(draws):
        j, batch = s.next_batch(recorded)
        batches[j] += 1
        tokens[j] += int(batch["attention_mask"].sum())
    # The counts are multinomial(draws, solved): each batch share within 5 binomial standard
    # errors, and each token share within 5 of its own, the counts' covariance carried to
    # tau_j = n_j t_j / sum_k n_k t_k to first order.
    batch_errors = np.sqrt(solved * (1 - solved) / draws)
    assert np.all(np.abs(batches / draws - solved) <= 5 * batch_errors)
    gradient = (np.diag(t) - np.outer(recorded, t)) / (solved @ t)
    covariance = (np.diag(solved) - np.outer(solved, solved)) / draws
    token_errors = np.sqrt(np.einsum("jk,kl,jl->j", gradient, covariance, gradient))
    assert np.all(np.abs(tokens / tokens.sum() - recorded) <= 5 * token_errors)


def test_batches_is_the_default_and_unknown_sampling_is_refused() -> None:
    streams = [stream(12, 0, seed=10), stream(7, 1, seed=11), stream(30, 2, seed=12)]
    default = MixtureSampler(streams, seed=3)
    explicit = MixtureSampler(
        [stream(12, 0, seed=10), stream(7, 1, seed=11), stream(30, 2, seed=12)],
        seed=3,
        sampling="batches",
    )
    assert run(default, 30) == run(explicit, 30)
    with pytest.raises(ValueError, match="sampling"):
        MixtureSampler(streams, seed=0, sampling="rows")

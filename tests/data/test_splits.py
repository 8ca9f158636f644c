"""Deterministic train/eval/test splits, budgets, and the whole pipeline of one source."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from dataclasses import replace
from pathlib import Path
from typing import Any

import datasets
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamics.data import (
    ChoiceExample,
    DataError,
    DataSource,
    LMExample,
    prepare_examples,
    split_examples,
    split_sizes,
)
from tests.fixtures.tiny_tokenizer import FIXTURES, tiny_tokenizer


def source(**fields: Any) -> DataSource:
    return DataSource(path="rows.jsonl", **fields)


@settings(max_examples=60, deadline=None)
@given(
    num_rows=st.integers(1, 300),
    eval_size=st.one_of(st.integers(0, 20), st.floats(0.0, 0.4)),
    test_size=st.one_of(st.integers(0, 20), st.floats(0.0, 0.4)),
    seed=st.integers(0, 2**32 - 1),
)
def test_splits_are_disjoint_cover_the_rows_and_are_deterministic(
    num_rows: int, eval_size: int | float, test_size: int | float, seed: int
) -> None:
    spec = source(eval_size=eval_size, test_size=test_size)
    rows = list(range(num_rows))
    try:
        sizes = split_sizes(num_rows, spec)
    except DataError:
        assert isinstance(eval_size, int) or isinstance(test_size, int)
        return
    parts = split_examples(rows, spec, seed)
    assert (len(parts.train), len(parts.eval), len(parts.test)) == sizes
    assert sorted(parts.train + parts.eval + parts.test) == rows
    assert parts == split_examples(rows, spec, seed)
    if isinstance(eval_size, float) and eval_size > 0 and num_rows - sizes[2] > 0:
        assert len(parts.eval) >= 1  # a non-zero fraction never gives an empty split


def test_fraction_and_count_sizes() -> None:
    assert split_sizes(95, source(eval_size=0.1, test_size=0.1)) == (75, 10, 10)
    assert split_sizes(95, source(eval_size=20, test_size=5)) == (70, 20, 5)
    assert split_sizes(101, source(eval_size=0.5, test_size=0.5)) == (0, 50, 51)
    assert split_sizes(100, source(eval_size=0, test_size=0, budget=30)) == (30, 0, 0)


def test_seed_changes_the_split() -> None:
    rows = list(range(200))
    assert split_examples(rows, source(), 0).test != split_examples(rows, source(), 1).test


def test_budget_is_a_nested_seeded_subset_after_the_held_out_splits() -> None:
    rows = list(range(500))
    everything = split_examples(rows, source(), seed=3)
    small = split_examples(rows, source(budget=50), seed=3)
    large = split_examples(rows, source(budget=300), seed=3)
    assert small.eval == large.eval == everything.eval
    assert small.test == large.test == everything.test
    assert len(small.train) == 50 and len(large.train) == 300
    assert set(small.train) < set(large.train) < set(everything.train)
    assert small.train != list(range(50))  # a random subset, not the file's head


def test_budget_larger_than_the_data_is_a_clear_error() -> None:
    with pytest.raises(
        DataError,
        match=r"budget=95 exceeds the 80 training rows .* 10 eval and 10 test rows of 100",
    ):
        split_sizes(100, source(budget=95))
    with pytest.raises(DataError, match=r"ask for 30 rows but it has 20"):
        split_sizes(20, source(eval_size=20, test_size=10))


def test_a_trained_source_needs_training_rows_and_an_evaluated_one_held_out_rows() -> None:
    assert split_sizes(20, source(eval_size=10, test_size=10)) == (0, 10, 10)  # evaluation only
    with pytest.raises(
        DataError, match=r"no training rows left after holding out 10 eval and 10 test"
    ):
        split_sizes(20, replace(source(eval_size=10, test_size=10), trained=True))
    assert split_sizes(20, source(eval_size=0, test_size=0)) == (20, 0, 0)  # training only
    with pytest.raises(DataError, match=r"leave 0 eval and 0 test rows of 20, but it is evaluated"):
        split_sizes(20, replace(source(eval_size=0, test_size=0), evaluated=True))


def test_dataset_rows_split_like_lists() -> None:
    rows = datasets.Dataset.from_list([{"text": str(i)} for i in range(40)])
    parts = split_examples(rows, source(budget=10), seed=7)
    as_list = split_examples([str(i) for i in range(40)], source(budget=10), seed=7)
    assert isinstance(parts.train, datasets.Dataset)
    assert parts.train["text"] == as_list.train and parts.test["text"] == as_list.test


def test_prepare_examples_end_to_end(tmp_path: Path) -> None:
    tokenizer = tiny_tokenizer()
    metamath = DataSource(
        path=str(FIXTURES / "metamath.jsonl"),
        format="instruction",
        prompt_column="query",
        budget=8,
        eval_size=3,
        test_size=3,
    )
    parts = prepare_examples(
        metamath, tokenizer, sequence_length=128, packing=False, seed=0, cache_dir=tmp_path
    )
    assert (len(parts.train), len(parts.eval), len(parts.test)) == (8, 3, 3)
    assert all(isinstance(e, LMExample) for e in [*parts.train, *parts.eval, *parts.test])
    mmlu = DataSource(
        path=str(FIXTURES / "tinymmlu.jsonl"),
        format="multiple_choice",
        eval_size=0.5,
        test_size=0.5,
    )
    parts = prepare_examples(
        mmlu, tokenizer, sequence_length=128, packing=True, seed=0, cache_dir=tmp_path
    )
    assert (len(parts.train), len(parts.eval), len(parts.test)) == (0, 3, 3)
    assert all(isinstance(e, ChoiceExample) for e in [*parts.eval, *parts.test])


def test_tokenization_is_cached_on_disk_and_reused(
    tmp_path: Path, tokenized_rows: list[int]
) -> None:
    """A second preparation of the same file with the same tokenizer settings (a new run, or
    another process on the machine) reads the tokens from datasets' cache instead of tokenizing."""
    calls = tokenized_rows
    source = DataSource(
        path=str(FIXTURES / "metamath.jsonl"), format="instruction", prompt_column="query"
    )
    first = prepare_examples(
        source, tiny_tokenizer(), sequence_length=128, packing=False, seed=0, cache_dir=tmp_path
    )
    assert sum(calls) == 16  # every row tokenized once, train, eval and test parts together
    assert len(list(tmp_path.rglob("cache-*.arrow"))) == 3  # one tokenized file per part
    again = prepare_examples(
        source, tiny_tokenizer(), sequence_length=128, packing=False, seed=0, cache_dir=tmp_path
    )
    assert sum(calls) == 16
    assert [e.input_ids.tolist() for e in again.train] == [
        e.input_ids.tolist() for e in first.train
    ]
    # Other settings are other tokens: a new tokenizer vocabulary tokenizes again.
    prepare_examples(
        source,
        tiny_tokenizer(vocab_size=300),
        sequence_length=128,
        packing=False,
        seed=0,
        cache_dir=tmp_path,
    )
    assert sum(calls) == 32


def test_an_evaluation_only_source_tokenizes_only_its_held_out_rows(
    tmp_path: Path, tokenized_rows: list[int]
) -> None:
    calls = tokenized_rows
    constraint = DataSource(
        path=str(FIXTURES / "metamath.jsonl"),
        format="instruction",
        prompt_column="query",
        evaluated=True,
        eval_size=3,
        test_size=2,
    )
    parts = prepare_examples(
        constraint, tiny_tokenizer(), sequence_length=128, packing=False, seed=0, cache_dir=tmp_path
    )
    assert (len(parts.train), len(parts.eval), len(parts.test)) == (0, 3, 2)
    assert sorted(calls) == [2, 3]  # the 11 other rows of the file are never tokenized

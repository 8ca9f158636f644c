"""Deterministic train/eval/test splits, sample budgets, and the whole data pipeline.

Public API:

- ``Splits(train, eval, test)``: the three parts of one dataset.
- ``split_sizes(num_rows, source) -> (train, eval, test)``: how many rows each part gets.
- ``split_examples(rows, source, seed) -> Splits``: split a ``datasets.Dataset`` (parts are
  ``Dataset.select`` views) or a sequence (parts are lists).
- ``prepare_examples(source, tokenizer, *, sequence_length, packing, seed)``: load, split
  and tokenize one source: ``Splits`` of example lists, tokenized once.

How a split is drawn: the row indices are shuffled once with ``numpy.random.default_rng(seed)``;
the first ``test`` of them are the test split, the next ``eval`` the evaluation split and the
first ``budget`` of the rest the training rows (all of the rest when ``budget`` is None). So
the held-out splits do not depend on the budget, a smaller budget's rows are a subset of a
larger one's, and the same seed gives the same split on every machine. Each part keeps the
rows in their file order (training order is drawn later, per epoch, by the sampler).

Sizes: an int ``eval_size``/``test_size`` is a row count, a float a fraction of all rows
rounded up (``0.1`` of 95 rows is 10), so a non-zero fraction never yields an empty split.
A source marked ``trained`` must keep a training row (and example), one marked ``evaluated``
an eval and a test row (and example); ``DataError`` names the dataset otherwise. Fewer rows
than a batch are fine: training batches and the fixed evaluation batches cycle the examples.
Rows are split *before* tokenization, so packing never mixes eval or test text into a
training block. The budget counts rows, which are examples when packing is off. An
evaluation-only source (``evaluated`` and not ``trained``: a run's constraint) tokenizes only
its eval and test rows; its training part is empty.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from dynamics.data.errors import DataError
from dynamics.data.examples import ChoiceExample, LMExample
from dynamics.data.fixed_length import Packing
from dynamics.data.formatting import build_examples
from dynamics.data.loading import load_rows
from dynamics.data.source import DataSource

T = TypeVar("T")
P = TypeVar("P")


@dataclass(frozen=True)
class Splits(Generic[P]):
    """The training rows (after the budget), the evaluation split and the test split."""

    train: P
    eval: P
    test: P


def _held_out(size: int | float, num_rows: int) -> int:
    return size if isinstance(size, int) else math.ceil(size * num_rows)


def split_sizes(num_rows: int, source: DataSource) -> tuple[int, int, int]:
    """Rows in (train, eval, test) for a dataset of ``num_rows`` rows; see the module doc."""
    test = _held_out(source.test_size, num_rows)
    evaluation = _held_out(source.eval_size, num_rows)
    if test + evaluation > num_rows:
        if not (isinstance(source.eval_size, float) and isinstance(source.test_size, float)):
            raise DataError(
                f"{source.description}: eval_size={source.eval_size} and test_size="
                f"{source.test_size} ask for {test + evaluation} rows but it has {num_rows}; "
                "lower them"
            )
        # Two fractions summing to at most 1 can overshoot by rounding up; eval gives way.
        evaluation = num_rows - test
    available = num_rows - test - evaluation
    if source.evaluated and (evaluation == 0 or test == 0):
        raise DataError(
            f"{source.description}: eval_size={source.eval_size} and test_size={source.test_size} "
            f"leave {evaluation} eval and {test} test rows of {num_rows}, but it is evaluated on "
            "both; raise them above 0"
        )
    if source.trained and available == 0:
        raise DataError(
            f"{source.description}: no training rows left after holding out {evaluation} eval and "
            f"{test} test rows of {num_rows}; add rows or lower eval_size/test_size"
        )
    if source.budget is None:
        return available, evaluation, test
    if source.budget > available:
        raise DataError(
            f"{source.description}: budget={source.budget} exceeds the {available} training "
            f"rows left after holding out {evaluation} eval and {test} test rows of {num_rows}; "
            "lower budget, eval_size or test_size"
        )
    return source.budget, evaluation, test


def split_examples(
    rows: datasets.Dataset | Sequence[T], source: DataSource, seed: int
) -> Splits[Any]:
    """Split ``rows`` into training (budgeted), eval and test parts, deterministically in
    ``seed``; the parts are disjoint and keep the rows' original order."""
    num_rows = len(rows)
    train, evaluation, test = split_sizes(num_rows, source)
    order = np.random.default_rng(seed).permutation(num_rows)
    parts = (
        np.sort(order[test + evaluation : test + evaluation + train]),
        np.sort(order[test : test + evaluation]),
        np.sort(order[:test]),
    )
    if isinstance(rows, datasets.Dataset):
        train_rows, eval_rows, test_rows = (rows.select(part) for part in parts)
        return Splits(train=train_rows, eval=eval_rows, test=test_rows)
    train_list, eval_list, test_list = ([rows[int(i)] for i in part] for part in parts)
    return Splits(train=train_list, eval=eval_list, test=test_list)


def prepare_examples(
    source: DataSource,
    tokenizer: PreTrainedTokenizerBase,
    *,
    sequence_length: int,
    packing: Packing,
    seed: int,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Splits[list[LMExample] | list[ChoiceExample]]:
    """Load ``source``, split its rows with ``seed`` and tokenize each part once (an
    evaluation-only source, ``evaluated`` and not ``trained``, only its eval and test parts)."""
    parts = split_examples(load_rows(source, cache_dir=cache_dir), source, seed)

    def build(
        rows: datasets.Dataset, part: str, needed: bool
    ) -> list[LMExample] | list[ChoiceExample]:
        if len(rows) == 0:
            return []
        examples = build_examples(
            rows, tokenizer, source, sequence_length=sequence_length, packing=packing
        )
        if needed and not examples:
            raise DataError(
                f"{source.description}: its {part} split has {len(rows)} rows but no examples "
                "(every row is blank, or its response starts after sequence_length="
                f"{sequence_length}); fix the rows or raise sequence_length"
            )
        return examples

    evaluation_only = source.evaluated and not source.trained
    return Splits(
        train=[] if evaluation_only else build(parts.train, "training", source.trained),
        eval=build(parts.eval, "eval", source.evaluated),
        test=build(parts.test, "test", source.evaluated),
    )

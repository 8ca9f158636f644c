"""Datasets: loading (``loading``), formatting and tokenization (``formatting``), splits
(``splits``) and the paper's scenarios (``scenarios``).

The data pipeline of one dataset, as the engine uses it::

    from dynamics.data import DataSource, prepare_examples

    source = DataSource(path="metamath.jsonl", format="instruction",
                        prompt_column="query", budget=2000)
    parts = prepare_examples(source, tokenizer, sequence_length=512, packing=False, seed=0)
    # parts.train / parts.eval / parts.test: lists of LMExample (ChoiceExample for
    # multiple-choice sources), tokenized once.

The names below are imported on first use, so that reading the scenario tables
(``dynamics.data.scenarios``) does not import ``datasets`` and ``transformers``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dynamics.data.formatting import (
        IGNORE_INDEX,
        ChoiceExample,
        Example,
        LMExample,
        build_examples,
        letter_token_ids,
        pad_token_id,
        tokenize_rows,
    )
    from dynamics.data.loading import DataError, DataSource, check_columns, load_rows
    from dynamics.data.splits import Splits, prepare_examples, split_examples, split_sizes

_EXPORTS: dict[str, str] = {
    "IGNORE_INDEX": "formatting",
    "ChoiceExample": "formatting",
    "Example": "formatting",
    "LMExample": "formatting",
    "build_examples": "formatting",
    "letter_token_ids": "formatting",
    "pad_token_id": "formatting",
    "tokenize_rows": "formatting",
    "DataError": "loading",
    "DataSource": "loading",
    "check_columns": "loading",
    "load_rows": "loading",
    "Splits": "splits",
    "prepare_examples": "splits",
    "split_examples": "splits",
    "split_sizes": "splits",
}

__all__ = [
    "IGNORE_INDEX",
    "ChoiceExample",
    "DataError",
    "DataSource",
    "Example",
    "LMExample",
    "Splits",
    "build_examples",
    "check_columns",
    "letter_token_ids",
    "load_rows",
    "pad_token_id",
    "prepare_examples",
    "split_examples",
    "split_sizes",
    "tokenize_rows",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dynamics.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dynamics.data.{_EXPORTS[name]}"), name)

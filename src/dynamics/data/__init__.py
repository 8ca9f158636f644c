"""Datasets, from where their rows are to the token examples a run trains and evaluates on.

- ``source``: ``DataSource``, one dataset described once (a run config's ``datasets:``
  entry is built from its fields); ``errors``: ``DataError``.
- ``loading``: reading the rows (``load_rows``); ``lm_eval_tasks``: an lm-eval task's rows.
- ``formats``: the row formats (``text``, ``instruction``, ``multiple_choice``), one module
  each, by name in ``formats.FORMATS``: the columns a row needs and how it is tokenized.
- ``conversations`` and ``chat_templates``: instruction rows as chats, and their rendering.
- ``formatting``: rows to examples (``tokenize_rows``, ``build_examples``); ``examples``,
  ``tokens`` and ``fixed_length``: the examples, a tokenizer's ids, truncation and packing.
- ``splits``: the train/eval/test parts of a dataset; ``scenarios``, ``paper_datasets`` and
  ``offline``: the paper's scenarios and datasets, and the generated offline domains.

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
    from dynamics.data.errors import DataError
    from dynamics.data.examples import IGNORE_INDEX, ChoiceExample, Example, LMExample
    from dynamics.data.formatting import build_examples, tokenize_rows
    from dynamics.data.loading import check_columns, load_rows
    from dynamics.data.source import DataSource
    from dynamics.data.splits import Splits, prepare_examples, split_examples, split_sizes
    from dynamics.data.tokens import letter_token_ids, pad_token_id

_EXPORTS: dict[str, str] = {
    "IGNORE_INDEX": "examples",
    "ChoiceExample": "examples",
    "Example": "examples",
    "LMExample": "examples",
    "build_examples": "formatting",
    "letter_token_ids": "tokens",
    "pad_token_id": "tokens",
    "tokenize_rows": "formatting",
    "DataError": "errors",
    "DataSource": "source",
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

"""Rows to token examples: each row tokenized once, by its row format, then cut to length.

Public API:

- ``tokenize_rows(rows, tokenizer, source) -> datasets.Dataset``: every row's token ids
  and loss labels (or, for a question scored by accuracy, its prompt and choices) through
  ``Dataset.map``, by the row format of the source (``dynamics.data.formats``), cached on
  disk for rows read from files (the cache key includes ``TOKENIZATION_VERSION``, a hash of
  the data layer's code).
- ``build_examples(rows, tokenizer, source, *, sequence_length, packing=False)``: tokenize
  every row once (``tokenize_rows``) into a list of examples (``LMExample`` for ``text`` and
  ``instruction`` sources and ``multiple_choice`` scored by loss, ``ChoiceExample`` for
  ``multiple_choice`` scored by accuracy), truncated or packed (``fixed_length``).

The examples (``LMExample``, ``ChoiceExample``, ``IGNORE_INDEX``) are defined in
``dynamics.data.examples`` and the tokenizer's ids (``pad_token_id``, ``letter_token_ids``)
in ``dynamics.data.tokens``; they are importable from here too.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets

from dynamics.data.errors import DataError
from dynamics.data.examples import IGNORE_INDEX, ChoiceExample, Example, LMExample
from dynamics.data.fixed_length import PACKING_MODES, Packing
from dynamics.data.formats import format_of
from dynamics.data.loading import check_columns
from dynamics.data.tokens import letter_token_ids, pad_token_id

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dynamics.data.source import DataSource

__all__ = [
    "IGNORE_INDEX",
    "TOKENIZATION_VERSION",
    "ChoiceExample",
    "Example",
    "LMExample",
    "Packing",
    "build_examples",
    "letter_token_ids",
    "pad_token_id",
    "tokenize_rows",
]

TOKENIZATION_VERSION = hashlib.sha256(
    b"".join(path.read_bytes() for path in sorted(Path(__file__).parent.rglob("*.py")))
).hexdigest()[:16]
"""A hash of the source of the data layer (every module of ``dynamics.data``, its row
formats included): part of the cache key of ``tokenize_rows``. ``datasets`` fingerprints a
module-level function by its name only, so without it a change of the prompt format, masking
or truncation code would read the tokens cached by the old code."""


def _encode_batch(
    batch: dict[str, list[Any]],
    indices: list[int],
    tokenizer: PreTrainedTokenizerBase,
    source: DataSource,
    version: str,
    chat_template: str | None = None,
) -> dict[str, list[Any]]:
    """``Dataset.map`` function: one batch of rows to token ids (see ``tokenize_rows``;
    ``version``, ``TOKENIZATION_VERSION``, only keys the cache; ``chat_template`` is the row
    format's, read once per source)."""
    rows = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
    start = indices[0] if indices else 0
    return format_of(source).encode(rows, tokenizer, source, start, chat_template)


def tokenize_rows(
    rows: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, source: DataSource
) -> datasets.Dataset:
    """Every row's token ids, through ``Dataset.map`` (batched): ``input_ids`` and ``labels``
    (whole documents, before truncation or packing), or for a question scored by accuracy
    ``input_ids`` (the whole prompt), ``choice_token_ids`` and ``answer_index``.

    Rows read from files are mapped into ``datasets``' cache next to their Arrow files, keyed
    by the rows, the tokenizer, the source's settings, the text of its chat template
    (the row format's ``chat_template``) and ``TOKENIZATION_VERSION`` (the data layer's
    code): a second run on the same machine, or
    a second process once the first has finished (``Accelerator.local_main_process_first``),
    reads the tokens instead of tokenizing again. Rows in memory are tokenized in memory.
    """
    row_format = format_of(source)
    return rows.map(
        _encode_batch,
        batched=True,
        with_indices=True,
        # The in-memory rows of a source are not part of what is tokenized (the rows are), but
        # its description ("rows in memory") stays in the error messages.
        fn_kwargs={
            "tokenizer": tokenizer,
            "source": dataclasses.replace(
                source,
                rows=None,
                origin="rows in memory" if source.rows is not None else source.origin,
            ),
            "version": TOKENIZATION_VERSION,
            # The template's text, not its path, so that an edited file is tokenized again.
            "chat_template": row_format.chat_template(tokenizer, source),
        },
        remove_columns=rows.column_names,
        features=row_format.features(source),
        desc=f"tokenizing {source.name or 'rows'}",
    )


def build_examples(
    rows: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    source: DataSource,
    *,
    sequence_length: int,
    packing: Packing = False,
) -> list[LMExample] | list[ChoiceExample]:
    """Tokenize every row of ``rows`` once (see ``dynamics.data.formats`` for the formats).

    ``sequence_length`` is the most tokens of one example. ``packing`` (False, True or
    ``"per-document"``) applies to ``text`` and ``instruction`` sources; a
    ``multiple_choice`` source is always one example per question, so one packing setting
    can serve every source of a run.
    """
    if packing not in PACKING_MODES:
        raise DataError(f"packing={packing!r}: use false, true or 'per-document'")
    if sequence_length < 1:
        raise DataError(f"sequence_length={sequence_length}: must be >= 1")
    check_columns(rows, source)
    encoded = tokenize_rows(rows, tokenizer, source)
    return format_of(source).examples(encoded, tokenizer, source, sequence_length, packing)

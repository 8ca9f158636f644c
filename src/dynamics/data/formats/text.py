"""``text``: plain documents, one per row (``text_column``), for continued pretraining.

Each is ``tokenizer(text)`` (with the tokenizer's own special tokens, e.g. BOS) plus EOS;
the loss is on every token. Empty documents are skipped (a warning counts them)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from dynamics.data.examples import LMExample
from dynamics.data.formats.base import RowFormat
from dynamics.data.formats.registry import register
from dynamics.data.rows import row_string
from dynamics.data.tokens import encode_texts, eos_token_id

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dynamics.data.source import DataSource

logger = logging.getLogger(__name__)


class TextFormat(RowFormat):
    name = "text"
    summary = "plain text"

    def required_columns(self, source: DataSource, columns: list[str]) -> list[str]:
        return [source.text_column]

    def column_fix(self, source: DataSource) -> str:
        return "set text_column"

    def documents(
        self,
        rows: list[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        source: DataSource,
        start: int,
        chat_template: str | None,
    ) -> list[LMExample]:
        texts = [
            row_string(row[source.text_column], source.text_column, start + i, source)
            for i, row in enumerate(rows)
        ]
        nonempty = [t for t in texts if t.strip()]
        if len(nonempty) < len(texts):
            logger.warning(
                "%s: skipped %d empty documents", source.description, len(texts) - len(nonempty)
            )
        eos = eos_token_id(tokenizer)
        documents = []
        for ids in encode_texts(tokenizer, nonempty, special=True):
            if not ids or ids[-1] != eos:
                ids.append(eos)
            array = np.asarray(ids, dtype=np.int32)
            documents.append(LMExample(input_ids=array, labels=array.copy()))
        return documents


register(TextFormat())

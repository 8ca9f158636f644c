"""``RowFormat``: what one row format does, from the columns it reads to the examples it
makes. A format module subclasses it and registers one instance (``registry.register``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import datasets
import numpy as np

from dynamics.data.examples import ChoiceExample, LMExample
from dynamics.data.fixed_length import Packing, fixed_length

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dynamics.data.source import DataSource

LM_FEATURES = datasets.Features(
    {
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "labels": datasets.Sequence(datasets.Value("int32")),
    }
)
"""The tokenized columns of documents: their ids and loss labels."""


class RowFormat:
    """A row format: its columns, its metrics, and how its rows become examples.

    A subclass sets ``name`` and defines ``required_columns``, ``column_fix`` and
    ``documents``; the defaults turn documents into language-modelling examples scored by
    loss, truncated or packed (``dynamics.data.fixed_length``). A format scored otherwise
    (``multiple_choice``'s accuracy) overrides ``encode``, ``features`` and ``examples``.
    """

    name: str
    """What ``DataSource.format`` (a run config's ``format``) names it by."""
    summary: str
    """What its rows are, in a few words, for the ``format`` field's documentation."""
    metrics: tuple[str, ...] = ("loss",)
    """The metrics a source of this format may be scored by; the first is its default."""
    trainable: bool = True
    """Whether a run may train on it (false: a run config's constraint only)."""
    packs: bool = True
    """Whether ``packing`` concatenates its documents (false: one example per row)."""
    renders_chats: bool = False
    """Whether its rows go through a chat template (``chat_template_path`` and
    ``chat_template_kwargs`` apply)."""

    def required_columns(self, source: DataSource, columns: list[str]) -> list[str]:
        """The columns a row needs, given the columns the rows have."""
        raise NotImplementedError

    def column_fix(self, source: DataSource) -> str:
        """How to fix rows that lack the columns: the ``DataSource`` fields naming them."""
        raise NotImplementedError

    def chat_template(self, tokenizer: PreTrainedTokenizerBase, source: DataSource) -> str | None:
        """The text of the template its rows are rendered with, read once per source and
        part of the tokenization's cache key; None for none."""
        return None

    def documents(
        self,
        rows: list[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        source: DataSource,
        start: int,
        chat_template: str | None,
    ) -> list[LMExample]:
        """A batch of rows (``start``: the index of the first) as whole documents, ``-100``
        labels where no loss is taken."""
        raise NotImplementedError

    def encode(
        self,
        rows: list[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        source: DataSource,
        start: int,
        chat_template: str | None,
    ) -> dict[str, list[Any]]:
        """A batch of rows as the columns of ``features`` (``Dataset.map``'s output)."""
        documents = self.documents(rows, tokenizer, source, start, chat_template)
        return {
            "input_ids": [d.input_ids for d in documents],
            "labels": [d.labels for d in documents],
        }

    def features(self, source: DataSource) -> datasets.Features:
        """The types of the columns ``encode`` returns."""
        return LM_FEATURES

    def examples(
        self,
        encoded: datasets.Dataset,
        tokenizer: PreTrainedTokenizerBase,
        source: DataSource,
        sequence_length: int,
        packing: Packing,
    ) -> list[LMExample] | list[ChoiceExample]:
        """The tokenized rows as examples of at most ``sequence_length`` tokens."""
        documents = [
            LMExample(
                input_ids=np.asarray(ids, dtype=np.int32),
                labels=np.asarray(labels, dtype=np.int32),
            )
            for ids, labels in zip(encoded["input_ids"], encoded["labels"], strict=True)
        ]
        special_ids = frozenset(tokenizer.all_special_ids)
        packed = packing if self.packs else False
        return fixed_length(documents, sequence_length, source, packed, special_ids)

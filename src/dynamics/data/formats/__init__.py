"""Row formats: what a dataset's rows are and how they become examples.

``FORMATS`` maps each format's name (``DataSource.format``, a run config's ``format``) to
its ``RowFormat``; ``format_of(source)`` is the format a source's rows are read with.

A format is one module of this package holding a ``RowFormat`` subclass (its columns, its
metrics, how a batch of rows becomes token ids and loss labels) that ends with
``register(...)`` of an instance, plus its name in the import of the format modules below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynamics.data.formats import (  # noqa: F401 (each module registers its format)
    instruction,
    multiple_choice,
    text,
)
from dynamics.data.formats.base import RowFormat
from dynamics.data.formats.lm_eval_choices import LM_EVAL_CHOICES
from dynamics.data.formats.registry import FORMATS

if TYPE_CHECKING:
    from dynamics.data.source import DataSource

__all__ = [
    "FORMATS",
    "LM_EVAL_CHOICES",
    "RowFormat",
    "format_names",
    "format_of",
    "format_summaries",
]


def format_names() -> tuple[str, ...]:
    """The names of the row formats, in the order they are registered."""
    return tuple(FORMATS)


def format_summaries() -> str:
    """Each format's name and what its rows are: ``text (plain text), ...``."""
    return ", ".join(f"{name} ({row_format.summary})" for name, row_format in FORMATS.items())


def format_of(source: DataSource) -> RowFormat:
    """The format ``source``'s rows are read with: an lm-eval task's rows are built by the
    task (``LM_EVAL_CHOICES``), any other source's by its ``format``."""
    if source.lm_eval_task is not None:
        return LM_EVAL_CHOICES
    return FORMATS[source.format]

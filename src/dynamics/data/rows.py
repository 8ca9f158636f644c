"""Values read from one row of a dataset, with errors that name the row and the column."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dynamics.data.errors import DataError

if TYPE_CHECKING:
    from dynamics.data.source import DataSource


def row_string(value: Any, column: str, index: int, source: DataSource) -> str:
    if not isinstance(value, str):
        raise DataError(
            f"{source.description}, row {index}: column {column!r} must hold a string, got "
            f"{type(value).__name__}"
        )
    return value

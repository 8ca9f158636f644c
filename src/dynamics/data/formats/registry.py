"""``FORMATS``: every row format by name, filled by ``register`` as each format's module is
imported (``dynamics.data.formats`` imports them all)."""

from __future__ import annotations

from dynamics.data.formats.base import RowFormat

FORMATS: dict[str, RowFormat] = {}
"""Each row format by its name (``DataSource.format``)."""


def register(row_format: RowFormat) -> RowFormat:
    """Add ``row_format`` to ``FORMATS`` under its name, once."""
    for attribute in ("name", "summary"):
        if not getattr(row_format, attribute, ""):
            raise ValueError(f"{type(row_format).__name__} sets no {attribute}: give the class one")
    if row_format.name in FORMATS:
        raise ValueError(f"row format {row_format.name!r} is registered twice")
    FORMATS[row_format.name] = row_format
    return row_format

"""``DataError``, the one error of the data layer, and ``one_line``, how its messages quote
another library's error."""

from __future__ import annotations


class DataError(ValueError):
    """A dataset that cannot be read or formatted; the message says what to change."""


def one_line(text: object, limit: int = 300) -> str:
    """``text`` with its whitespace collapsed onto one line, cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."

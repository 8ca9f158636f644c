"""Fixtures shared by the data tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def tokenized_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of instruction rows of each tokenization call made during the test, so
    a test can tell rows tokenized from rows read from datasets' cache."""
    from dynamics.data.formats.instruction import InstructionFormat

    calls: list[int] = []
    tokenize = InstructionFormat.documents

    def counting(self: Any, rows: list[dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
        calls.append(len(rows))
        return tokenize(self, rows, *args, **kwargs)

    monkeypatch.setattr(InstructionFormat, "documents", counting)
    return calls


@pytest.fixture
def load_dataset_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of each ``load_dataset`` call the loading module makes during
    the test, so a test can tell a read from the source from a read of the cache."""
    from dynamics.data import loading

    calls: list[dict[str, Any]] = []
    real = loading.load_dataset

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(loading, "load_dataset", spy)
    return calls

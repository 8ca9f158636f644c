"""Fixtures shared by the data tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def tokenized_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of instruction rows of each tokenization call made during the test, so
    a test can tell rows tokenized from rows read from datasets' cache."""
    from dynamics.data import formatting

    calls: list[int] = []
    tokenize = formatting._instruction_documents

    def counting(rows: list[dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
        calls.append(len(rows))
        return tokenize(rows, *args, **kwargs)

    monkeypatch.setattr(formatting, "_instruction_documents", counting)
    return calls

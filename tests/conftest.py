"""Fixtures shared by the test packages."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.tiny_tokenizer import tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """The tiny fixture tokenizer, saved as a folder (``model.tokenizer`` of the tiny configs)."""
    folder = tmp_path_factory.mktemp("tokenizer")
    tiny_tokenizer().save_pretrained(folder)
    return folder

"""Fixtures shared by the test packages; where the tests keep their caches; no network.

The tests write only into their temporary folders and into ``.cache/tests`` at the
repository root (gitignored, kept between runs): ``XDG_CACHE_HOME`` points there, so the
demo's base model (``$XDG_CACHE_HOME/dynamics``), the datasets and hub caches and
matplotlib's font cache are built there once, never in the user's ``~/.cache``. This is
set before anything imports ``datasets``, ``huggingface_hub`` or ``matplotlib``, which read
it once; subprocesses the tests start inherit it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TEST_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "tests"
os.environ["XDG_CACHE_HOME"] = str(TEST_CACHE)
os.environ["HF_HOME"] = str(TEST_CACHE / "huggingface")
os.environ["MPLCONFIGDIR"] = str(TEST_CACHE / "matplotlib")
for variable in ("HF_DATASETS_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TORCH_HOME"):
    os.environ.pop(variable, None)  # each defaults to a folder under the two above
# No test touches the network (as scripts/test.sh runs them); set here because the import
# below reads it once, before any test package's own conftest.
for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(variable, "1")
# The research code of benchmarks/ (robustness, goal) is tested as its scripts import it:
# by module name, from that folder.
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

from tests.fixtures.in_process import one_thread  # noqa: E402
from tests.fixtures.tiny_tokenizer import tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """The tiny fixture tokenizer, saved as a folder (``model.tokenizer`` of the tiny configs)."""
    folder = tmp_path_factory.mktemp("tokenizer")
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture
def single_thread() -> Iterator[None]:
    """torch on one thread for the test, as the runs it compares with train, and the
    thread count as it was afterwards."""
    with one_thread():
        yield

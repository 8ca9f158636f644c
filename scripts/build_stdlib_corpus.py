"""Write the demo's pinned corpus: the sources of ``STDLIB_MODULES`` from this interpreter.

    python scripts/build_stdlib_corpus.py   # writes src/dynamics/data/stdlib_corpus.json.gz

The demo reads its ``code``, ``prose`` and quiz facts from that file, not from the running
interpreter, so every machine builds the same base model. After rebuilding it, set
``STDLIB_CORPUS_SHA256`` in ``dynamics/data/offline.py`` to the digest this prints (cached
base models are keyed on it, so they are rebuilt).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import platform
import sysconfig
from pathlib import Path

from dynamics.data.offline import STDLIB_CORPUS, STDLIB_MODULES


def main() -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    modules = {}
    for module in STDLIB_MODULES:
        stem = root.joinpath(*module.split("."))
        path = next(p for p in (stem.with_suffix(".py"), stem / "__init__.py") if p.is_file())
        modules[module] = path.read_text(encoding="utf-8")
    payload = json.dumps(
        {"python": platform.python_version(), "modules": modules}, sort_keys=True
    ).encode()
    # mtime=0: the same sources give the same bytes.
    STDLIB_CORPUS.write_bytes(gzip.compress(payload, compresslevel=9, mtime=0))
    print(hashlib.sha256(STDLIB_CORPUS.read_bytes()).hexdigest())


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Create .venv with the pinned dependencies (CPU torch 2.13.0) and install dynamics into it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# torch first, exactly pinned: an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/pip install --quiet torch==2.13.0
.venv/bin/pip install --quiet -e ".[train,dev]"

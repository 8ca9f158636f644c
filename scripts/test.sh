#!/usr/bin/env bash
# Set up (if needed) and run the linters, the type checker and the tests.
#   bash scripts/test.sh          every test: what CI runs (.ci/run)
#   bash scripts/test.sh --fast   leaves out the tests marked slow (training in subprocesses
#                                 or several processes, the demo and its base model, Ray
#                                 sweeps, the real SmolLM2 model, the benchmarks); ruff and
#                                 mypy still run
# Further arguments go to pytest (e.g. --durations=20, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
select=()
if [ "${1:-}" = "--fast" ]; then
  shift
  select=(-m "not slow")
fi
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check src tests benchmarks
.venv/bin/mypy
.venv/bin/python -m pytest -q ${select[@]+"${select[@]}"} "$@" tests

#!/usr/bin/env bash
# Set up (if needed) and run the linters, the type checker and the tests.
#   bash scripts/test.sh             the suite: every test except the demo's headline
#   bash scripts/test.sh --fast      leaves out the tests marked slow as well (training in
#                                    subprocesses or several processes, the demo, Ray sweeps,
#                                    the real SmolLM2 model, the benchmarks)
#   bash scripts/test.sh --main-job  only the tests marked main_job: the demo's headline,
#                                    reproduced from the demo's own base model (installed
#                                    from the shipped weights into .cache/tests on first use)
# CI (.ci/run) runs the suite, then --main-job. Ruff and mypy run with the suite and --fast.
# Further arguments go to pytest (e.g. --durations=20, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
select=(-m "not main_job")
lint=1
case "${1:-}" in
  --fast) shift; select=(-m "not slow and not main_job") ;;
  --main-job) shift; select=(-m "main_job"); lint=0 ;;
esac
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "$lint" = 1 ]; then
  .venv/bin/ruff check src tests benchmarks
  .venv/bin/ruff format --check src tests benchmarks
  .venv/bin/mypy
fi
.venv/bin/python -m pytest -q "${select[@]}" "$@" tests

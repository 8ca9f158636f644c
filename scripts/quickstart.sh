#!/usr/bin/env bash
# Set up (if needed) and run the main job offline: a DynaMiCS run on a tiny model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out="runs/tiny-$(date +%Y%m%d-%H%M%S)"
.venv/bin/dynamics run examples/tiny-run.yaml --out "$out"
.venv/bin/dynamics report "$out"

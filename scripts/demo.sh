#!/usr/bin/env bash
# Set up (if needed) and run the main job offline: `dynamics demo` (add --quick for a short one).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/dynamics demo "$@"

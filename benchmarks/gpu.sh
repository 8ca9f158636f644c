#!/usr/bin/env bash
# The GPU check: the engine on CUDA at a real model's size, in one command, printing one
# JSON object. No downloads: the model is randomly initialised with the shape of
# Qwen/Qwen2.5-0.5B (benchmarks/shapes.py), bf16 mixed precision, LoRA rank 32, sequences
# of 512 tokens, batch 8. It reports:
#   engine:        engine tokens/s over a plain transformers + PEFT loop, one snapshot +
#                  restore over one training step, peak GPU memory (benchmarks/engine.py);
#   run_overhead:  DynaMiCS over a fixed mixture in training wall time at reduced steps,
#                  beside the cost model's prediction, and each run's peak GPU memory
#                  (benchmarks/run_overhead.py).
# Meant to take under 8 minutes on one H100. DYNAMICS_GPU_CHECK_TOY=1 runs the same script at
# a toy size on a CPU in about a minute (the test suite does, so the script cannot rot).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
if [ "${DYNAMICS_GPU_CHECK_TOY:-0}" = "1" ]; then
  SIZE=(--shape tiny --seq 64 --batch 2 --lora-rank 8 --mixed-precision no)
  ENGINE_STEPS=4
  RUN_STEPS=16
else
  SIZE=(--shape qwen2.5-0.5b --seq 512 --batch 8 --lora-rank 32 --mixed-precision bf16)
  ENGINE_STEPS=20
  RUN_STEPS=64
fi
engine=$("$PYTHON" benchmarks/engine.py "${SIZE[@]}" --steps "$ENGINE_STEPS")
overhead=$("$PYTHON" benchmarks/run_overhead.py "${SIZE[@]}" --steps "$RUN_STEPS")
"$PYTHON" - "$engine" "$overhead" <<'PY'
import json
import sys

import torch

print(json.dumps({
    "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    "torch": torch.__version__,
    "engine": json.loads(sys.argv[1]),
    "run_overhead": json.loads(sys.argv[2]),
}, indent=2))
PY

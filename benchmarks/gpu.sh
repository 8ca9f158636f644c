#!/usr/bin/env bash
# The GPU check: the engine on CUDA at a real model's size, in one command, printing one
# JSON object. No downloads: models are randomly initialised (benchmarks/shapes.py). In
# order, each under its own time limit, a failure recorded in the JSON and the next one run:
#   engine:        Qwen2.5-0.5B's shape, bf16 mixed precision, LoRA rank 32, sequences of
#                  512, batch 8: engine tokens/s over a plain transformers + PEFT loop, one
#                  snapshot + restore over one training step (goal <= 0.05 for LoRA), peak
#                  GPU memory; above the goal, the torch profiler's top entries by CUDA time
#                  over one LoRA snapshot + restore (benchmarks/engine.py --profile above-goal);
#   run_overhead:  DynaMiCS over a fixed mixture in training wall time (a discarded warm-up
#                  run first), same shape, 32 steps with the paper's evaluation settings
#                  scaled by 32/2048 (every step on 3 batches, probes on 1), beside the cost
#                  model, and each run's peak GPU memory (benchmarks/run_overhead.py
#                  --paper-evaluation);
#   paper_shape:   the paper's cost at the paper's shape: Qwen2.5-3B's shape, LoRA 32,
#                  sequences of 512, batch 8, evaluations every 64 steps on 200 batches and
#                  probes on 50, dense warm-up, as far as DYNAMICS_PAPER_SECONDS (90) allow;
#                  measured unit costs and the cost model's 2,048-step prediction from them
#                  (run_overhead.py --paper-shape; DYNAMICS_PAPER_SCALE shrinks the model);
#   fsdp_resume:   a LoRA run under FSDP2 stopped and resumed (benchmarks/fsdp_resume.py),
#                  only with two GPUs or more, else skipped with the reason;
#   qlora:         the engine row for QLoRA (model.quantization {bits: 4}) at the engine's
#                  shape: tokens/s, snapshot + restore over one step, peak memory; skipped
#                  with the reason without a GPU or bitsandbytes. bitsandbytes is installed
#                  only from wheels carried onto the machine (DYNAMICS_WHEELS, default
#                  wheels/; pip --no-index), never from the internet;
#   scoring:       multiple-choice scoring (letters, and lm-eval continuations) from the
#                  scored positions' logits against every position's, Qwen2.5-0.5B's shape:
#                  logits bytes, time, peak GPU memory (benchmarks/scoring.py).
# Meant to take under 8 minutes on one H100 (each section's seconds are in the JSON); no
# section starts after DYNAMICS_GPU_CHECK_SECONDS (480), and each is cut to what is left.
# DYNAMICS_GPU_CHECK_SECTIONS (a comma-separated list, default all six) runs only the
# sections it names; the others are recorded as skipped, saying so.
# DYNAMICS_GPU_CHECK_TOY=1 runs the same script at a toy size on a CPU, profiler included,
# in about a minute (the test suite does, so the script cannot rot).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
WHEELS="${DYNAMICS_WHEELS:-wheels}"
if [ "${DYNAMICS_GPU_CHECK_TOY:-0}" = "1" ]; then
  SIZE=(--shape tiny --seq 64 --batch 2 --lora-rank 8 --mixed-precision no)
  ENGINE_STEPS=4
  PROFILE=always
  OVERHEAD=(--steps 16)
  PAPER=(--scale 0.005 --seq 32 --batch 1 --seconds 5)
  SCORING=(--shape tiny --questions 3 --length 16 --repeats 1)
else
  SIZE=(--shape qwen2.5-0.5b --seq 512 --batch 8 --lora-rank 32 --mixed-precision bf16)
  ENGINE_STEPS=20
  PROFILE=above-goal
  OVERHEAD=(--steps 32)
  PAPER=(--scale "${DYNAMICS_PAPER_SCALE:-1}" --seconds "${DYNAMICS_PAPER_SECONDS:-90}")
  SCORING=(--shape qwen2.5-0.5b --layers 24 --questions 18 --length 300 --repeats 3)
fi
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
started=$SECONDS

# The whole script stops starting sections at DEADLINE seconds, so that its JSON comes back
# within a session's time limit even when a section hangs.
DEADLINE="${DYNAMICS_GPU_CHECK_SECONDS:-480}"

# section NAME LIMIT_S COMMAND...: stdout to NAME.json, stderr to NAME.err, seconds and exit
# status to NAME.meta; a failure or a timeout does not stop the script. The limit is cut to
# what is left before DEADLINE; with under 20 s left the section is skipped.
ALL_SECTIONS=engine,run_overhead,paper_shape,fsdp_resume,qlora,scoring
SECTIONS="${DYNAMICS_GPU_CHECK_SECTIONS:-$ALL_SECTIONS}"
for name in ${SECTIONS//,/ }; do
  if [[ ",$ALL_SECTIONS," != *",$name,"* ]]; then
    echo "DYNAMICS_GPU_CHECK_SECTIONS: unknown section '$name'; the sections are ${ALL_SECTIONS//,/, }" >&2
    exit 2
  fi
done
wanted() { [[ ",$SECTIONS," == *",$1,"* ]]; }

section() {
  local name=$1 limit=$2 begin=$SECONDS rc=0
  local left=$((DEADLINE - (SECONDS - started)))
  shift 2
  if ! wanted "$name"; then
    skip "$name" "not in DYNAMICS_GPU_CHECK_SECTIONS ($SECTIONS)"
    return
  fi
  if [ "$left" -lt 20 ]; then
    skip "$name" "the script's deadline (DYNAMICS_GPU_CHECK_SECONDS=$DEADLINE) left ${left} s"
    return
  fi
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  timeout "$limit" "$@" >"$OUT/$name.json" 2>"$OUT/$name.err" || rc=$?
  echo "$((SECONDS - begin)) $rc $limit" >"$OUT/$name.meta"
}
skip() { echo "$2" >"$OUT/$1.skip"; }

section engine 150 "$PYTHON" benchmarks/engine.py "${SIZE[@]}" --steps "$ENGINE_STEPS" --profile "$PROFILE"
section run_overhead 300 "$PYTHON" benchmarks/run_overhead.py "${SIZE[@]}" "${OVERHEAD[@]}" --paper-evaluation
section paper_shape $((${DYNAMICS_PAPER_SECONDS:-90} + 90)) "$PYTHON" benchmarks/run_overhead.py --paper-shape "${PAPER[@]}"

# The machine, read once: the GPU count, then the torch version and the device's name.
mapfile -t machine < <("$PYTHON" -c "import torch; n = torch.cuda.device_count(); print(n); print(torch.__version__); print(torch.cuda.get_device_name(0) if n else 'cpu')")
gpus=${machine[0]}
if ! wanted fsdp_resume; then
  skip fsdp_resume "not in DYNAMICS_GPU_CHECK_SECTIONS ($SECTIONS)"
elif [ "$gpus" -ge 2 ]; then
  section fsdp_resume 150 "$PYTHON" benchmarks/fsdp_resume.py --processes "$gpus"
else
  skip fsdp_resume "needs two GPUs or more (a real test of gathering shards); this machine has $gpus"
fi

has_bnb() { "$PYTHON" -c "import bitsandbytes" >/dev/null 2>&1; }
if ! wanted qlora; then
  skip qlora "not in DYNAMICS_GPU_CHECK_SECTIONS ($SECTIONS)"
elif [ "$gpus" -lt 1 ]; then
  skip qlora "needs a CUDA GPU (bitsandbytes' 4-bit layers); this machine has none"
else
  if ! has_bnb && [ -d "$WHEELS" ]; then
    "$PYTHON" -m pip install --quiet --no-index --find-links "$WHEELS" bitsandbytes >"$OUT/pip.log" 2>&1 || true
  fi
  if has_bnb; then
    section qlora 120 "$PYTHON" benchmarks/engine.py "${SIZE[@]}" --steps "$ENGINE_STEPS" --quantization 4
  else
    why="bitsandbytes is not installed and could not be installed from $WHEELS (DYNAMICS_WHEELS; pip --no-index): carry its wheel onto the machine"
    [ -f "$OUT/pip.log" ] && why="$why; pip: $(tail -c 500 "$OUT/pip.log" | tr '\n' ' ')"
    skip qlora "$why"
  fi
fi

section scoring 90 "$PYTHON" benchmarks/scoring.py "${SCORING[@]}"

"$PYTHON" - "$OUT" "$((SECONDS - started))" "$gpus" "${machine[1]}" "${machine[2]}" <<'PY'
import json
import sys
from pathlib import Path

out, total = Path(sys.argv[1]), int(sys.argv[2])
result = {"device": sys.argv[5], "gpus": int(sys.argv[3]), "torch": sys.argv[4]}
for name in ("engine", "run_overhead", "paper_shape", "fsdp_resume", "qlora", "scoring"):
    skipped = out / f"{name}.skip"
    if skipped.exists():
        result[name] = {"skipped": skipped.read_text().strip()}
        continue
    seconds, rc, limit = (int(v) for v in (out / f"{name}.meta").read_text().split())
    try:
        section = json.loads((out / f"{name}.json").read_text())
    except ValueError:
        section = None
    if rc != 0 or section is None:
        why = f"timed out after {limit} s" if rc == 124 else f"exit status {rc}"
        section = {"failed": why, "stderr_tail": (out / f"{name}.err").read_text()[-3000:]}
    result[name] = {**section, "section_seconds": seconds}
result["total_seconds"] = total
print(json.dumps(result, indent=2))
PY

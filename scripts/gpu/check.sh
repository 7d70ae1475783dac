#!/usr/bin/env bash
# Everything that needs a GPU, in one run of under 8 minutes on an H200 (see scripts/gpu/check.py):
# Triton kernels vs the PyTorch backend, fp32 greedy tokens vs HF transformers (CUDA graphs on),
# the bf16-slowdown check, Qwen3-0.6B / Llama-3.1-8B shapes (decode vs roofline, graphs vs eager,
# prefill, memory, vs HF), then the in-process adapters.
#
# Usage: bash scripts/gpu/check.sh [OUT_DIR]        (OUT_DIR, else $OUT, else /tmp/gpu_check)
#        bash scripts/gpu/check.sh --smoke [OUT_DIR] (no GPU: the same code on CPU at toy sizes)
# Writes OUT_DIR/gpu_check.md (the summary, as it goes) and OUT_DIR/gpu_check.log (everything).
# Exit: 0 all correct and every target met; 1 something wrong (or a part timed out); 3 correct but
# a performance target missed; 2 no GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
SMOKE=()
if [ "${1:-}" = "--smoke" ]; then SMOKE=(--smoke); shift; fi
OUT_DIR="${1:-${OUT:-/tmp/gpu_check}}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
start=$(date +%s)
{
  echo "gpu/check.sh $(date -u '+%Y-%m-%d %H:%M:%S') UTC, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || echo "nvidia-smi: not found"
} 2>&1 | tee "$LOG"

# nvidia-ml-py (pyproject's [gpu] extra) for the memory report's NVML readings (device_used, process_used).
# The GPU machine may have no internet: try briefly, and run without it (those keys are then absent).
if [ ${#SMOKE[@]} -eq 0 ]; then
  if "$PY" -c "import pynvml" 2>/dev/null; then
    echo "gpu/check.sh: nvidia-ml-py already installed"
  elif timeout 60 "$PY" -m pip install -q --disable-pip-version-check --retries 0 --timeout 15 "nvidia-ml-py>=12"; then
    echo "gpu/check.sh: installed nvidia-ml-py"
  else
    echo "gpu/check.sh: could not install nvidia-ml-py (no network?); continuing without NVML readings"
  fi 2>&1 | tee -a "$LOG"
fi

timeout --kill-after=10 430 "$PY" scripts/gpu/check.py --out "$OUT_DIR" ${SMOKE[@]+"${SMOKE[@]}"} 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "gpu/check.sh: FAILED: scripts/gpu/check.py ran past its 430 s (see $LOG; $OUT_DIR/gpu_check.md has what it found)" | tee -a "$LOG"
  rc=1
fi

if [ ${#SMOKE[@]} -eq 0 ]; then
  timeout --kill-after=10 40 "$PY" scripts/gpu/adapters.py --device cuda --dtype float32 2>&1 | tee -a "$LOG"
  arc=${PIPESTATUS[0]}
  if [ "$arc" -ne 0 ]; then
    echo "gpu/check.sh: FAILED: scripts/gpu/adapters.py exited $arc" | tee -a "$LOG"
    rc=1
  fi
fi

echo "gpu/check.sh: exit $rc after $(( $(date +%s) - start )) s; summary $OUT_DIR/gpu_check.md, log $LOG" | tee -a "$LOG"
exit "$rc"

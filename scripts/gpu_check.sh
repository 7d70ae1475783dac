#!/usr/bin/env bash
# Everything that needs a GPU, in one short run (a few minutes on an H200):
# the reference engine on CUDA vs HF transformers (tokens, speed), then the in-process adapters.
# Usage: bash scripts/gpu_check.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-/tmp/gpu_check}}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 scripts/gpu_check.py --out "$OUT"; rc=$?
python3 scripts/gpu_check_adapters.py --device cuda --dtype float32 || rc=1
exit $rc

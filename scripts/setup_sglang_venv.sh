#!/usr/bin/env bash
# Create .venv-sglang: SGLang's own Python code, enough to import its argument parser
# (sglang.srt.server_args), its OpenAI request models (sglang.srt.entrypoints.openai.protocol)
# and its sampling parameters on a CPU machine, for the SGLang adapter's contract tests
# (tests/adapters/sglang_contract.py). Not a working engine: SGLang's GPU dependencies
# (sgl-kernel, flashinfer, triton, CUDA torch) are left out; the wheel goes in with --no-deps,
# beside CPU torch and a few light packages its modules import at the top.
# Idempotent: a venv that already has the pinned versions is left alone (exit 0 at once).
# Usage: scripts/setup_sglang_venv.sh [VENV_DIR]   (env PYTHON picks the base interpreter;
# INSTALLER=pip installs with pip instead of uv, see scripts/venv_install.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-sglang}"
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0   # the CPU build, as `make setup` installs it
LIGHT=(msgspec numpy orjson psutil pybase64 requests packaging pillow starlette anyio pydantic pyzmq tqdm
       ipython aiohttp openai transformers pyyaml dill prometheus_client)

ready() {
  "$VENV/bin/python" - "$SGLANG_VERSION" "$TORCH_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
assert version("sglang") == sys.argv[1], "sglang version"
assert version("torch").split("+")[0] == sys.argv[2], "torch version"
PY
}

if [ -x "$VENV/bin/python" ] && ready; then
  echo "$VENV: sglang $SGLANG_VERSION already installed"
  exit 0
fi
bash scripts/venv_install.sh "$VENV" "torch==$TORCH_VERSION" "${LIGHT[@]}"
bash scripts/venv_install.sh "$VENV" --no-deps "sglang==$SGLANG_VERSION"
ready || { echo "$VENV: install finished but the check failed" >&2; exit 1; }
echo "$VENV: sglang $SGLANG_VERSION (no GPU dependencies) for the contract tests"

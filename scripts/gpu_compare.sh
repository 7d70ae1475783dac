#!/usr/bin/env bash
# The side-by-side comparison on a GPU host: the same small workload (experiments/configs/
# gpu_compare.toml) through every engine found here, one report.
#
#   bash scripts/gpu_compare.sh [--dry-run] [OUT_DIR]   (default: results/gpu_compare-<date>)
#   CONFIG=experiments/configs/gpu_parallel.toml bash scripts/gpu_compare.sh   (TP 1/2/4/8 on a multi-GPU host)
#
# An engine is found when its package or server command is installed for this python, or, for
# the server engines, when its pinned docker image is on this host (pulls are not made for you; the
# skip line names the `docker pull` to run). The pins are the versions the adapters were checked
# against (adapters/common/versions.py and each adapter's VERSIONS; an adapter refuses any other version):
#   vllm    import vllm            | image VLLM_IMAGE   (default vllm/vllm-openai:v0.32.0)
#   sglang  import sglang          | image SGLANG_IMAGE (default lmsysorg/sglang:v0.5.23-cu130)
#   trtllm  trtllm-serve on PATH   | image TRTLLM_IMAGE (default nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24)
#   tgi     text-generation-launcher on PATH | image TGI_IMAGE (default ghcr.io/huggingface/text-generation-inference:3.3.7)
#   llamacpp LLAMACPP_SERVER (a CUDA build of llama-server b11312) | image LLAMACPP_IMAGE (default
#           ghcr.io/ggml-org/llama.cpp:server-cuda-b11312), every layer offloaded (-ngl 999); optional: the
#           CPU build `make llamacpp` makes is not what a GPU comparison wants, so it is not used here
#   hf      import transformers;  reference: always (inferlab's own engine, on CUDA)
# It prints which engines were found and which were skipped and why, writes them to
# OUT/engines.txt, then runs `inferlab run` on a copy of the config listing the engines found
# (OUT/gpu_compare.toml) and writes OUT/gpu_compare/report.md. Set MODEL=/path/to/hf-model to
# compare on a real model instead of the generated one (then set DTYPE to what it was trained in).
# It then runs `inferlab run OUT/gpu_compare.toml --dry-run` (OUT/dry_run.txt) and stops if any check
# fails; --dry-run stops after it, having started nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0; [ "${1:-}" = "--dry-run" ] && { DRY=1; shift; }
OUT="$(realpath -m "${1:-results/gpu_compare-$(date +%Y%m%d-%H%M%S)}")"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
  || echo "warning: nvidia-smi found no GPU; engines that need one will fail to start" >&2

found=(reference) ; declare -A why opts
has_py() { "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }
VLLM_IMAGE="${VLLM_IMAGE:-vllm/vllm-openai:v0.32.0}"
SGLANG_IMAGE="${SGLANG_IMAGE:-lmsysorg/sglang:v0.5.23-cu130}"
TRTLLM_IMAGE="${TRTLLM_IMAGE:-nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24}"
TGI_IMAGE="${TGI_IMAGE:-ghcr.io/huggingface/text-generation-inference:3.3.7}"
LLAMACPP_IMAGE="${LLAMACPP_IMAGE:-ghcr.io/ggml-org/llama.cpp:server-cuda-b11312}"
image() {  # $1: the pinned (or overridden) image -> itself when it is on this host, else nothing
  command -v docker >/dev/null 2>&1 || return 0
  docker image inspect "$1" >/dev/null 2>&1 && echo "$1" || true
}
docker_launcher() {  # the model and OUT are mounted at the same paths (the engines' option files live in OUT)
  echo "docker run --rm --gpus all --ipc host --network host -v {model}:{model} -v $OUT:$OUT $*"
}

if has_py transformers; then found+=(hf); else why[hf]="transformers is not importable for $PY"; fi

if has_py vllm; then found+=(vllm)
elif img=$(image "$VLLM_IMAGE") && [ -n "$img" ]; then found+=(vllm); opts[vllm]="launcher = \"$(docker_launcher "$img")\""
else why[vllm]="vllm is not importable and $VLLM_IMAGE is not on this host (docker pull $VLLM_IMAGE)"; fi

if has_py sglang; then found+=(sglang)
elif img=$(image "$SGLANG_IMAGE") && [ -n "$img" ]; then found+=(sglang); opts[sglang]="launcher = \"$(docker_launcher --shm-size 16g "$img")\""
else why[sglang]="sglang is not importable and $SGLANG_IMAGE is not on this host (docker pull $SGLANG_IMAGE)"; fi

if command -v trtllm-serve >/dev/null 2>&1; then found+=(trtllm); opts[trtllm]="launcher = \"$("$PY" -c 'import sys; print(sys.executable)')\""
elif img=$(image "$TRTLLM_IMAGE") && [ -n "$img" ]; then found+=(trtllm); opts[trtllm]="launcher = \"$(docker_launcher --ulimit memlock=-1 --ulimit stack=67108864 "$img")\""
else why[trtllm]="trtllm-serve is not on PATH and $TRTLLM_IMAGE is not on this host (docker pull $TRTLLM_IMAGE)"; fi

if command -v text-generation-launcher >/dev/null 2>&1; then found+=(tgi)
elif img=$(image "$TGI_IMAGE") && [ -n "$img" ]; then found+=(tgi); opts[tgi]="launcher = \"$(docker_launcher --shm-size 1g "$img")\""
else why[tgi]="text-generation-launcher is not on PATH and $TGI_IMAGE is not on this host (docker pull $TGI_IMAGE)"; fi

if [ -z "${MODEL:-}" ]; then  # llama.cpp's converter refuses a tokenizer it has no hash for: ours
  why[llamacpp]="it needs MODEL= a real model (llama.cpp's converter does not know the generated model's tokenizer)"
elif [ -n "${LLAMACPP_SERVER:-}" ]; then found+=(llamacpp)
elif img=$(image "$LLAMACPP_IMAGE") && [ -n "$img" ]; then found+=(llamacpp); opts[llamacpp]="launcher = \"$(docker_launcher "$img")\""
else why[llamacpp]="LLAMACPP_SERVER is not set and $LLAMACPP_IMAGE is not on this host (docker pull $LLAMACPP_IMAGE)"; fi

{
  echo "found: ${found[*]}"
  for e in hf vllm sglang trtllm tgi llamacpp; do [ -n "${why[$e]:-}" ] && echo "skipped $e: ${why[$e]}"; done
} | tee "$OUT/engines.txt"

# The config copy: the engines found, each engine's launcher, and MODEL / DTYPE when given.
SRC="${CONFIG:-experiments/configs/gpu_compare.toml}"
NAME=$(sed -n 's/^name = "\(.*\)".*/\1/p' "$SRC" | head -1)
CFG="$OUT/$(basename "$SRC")"
# an engine the config does not list stays out (gpu_parallel.toml has no hf: it runs on one device)
keep=$(sed -n 's/^\(optional_\)\?engines = \[\(.*\)\].*/\2/p' "$SRC" | tr -d ' "' | tr ',' '\n' | sort -u
       [ -n "${MODEL:-}" ] && grep -q "^\[engine_options.llamacpp\]" "$SRC" && echo llamacpp)  # only on a real model
list=$(printf '"%s", ' $(for e in "${found[@]}"; do grep -qx "$e" <<<"$keep" && echo "$e"; done)); list="[${list%, }]"
sed -e "s|^engines = .*|engines = $list|" -e 's|^optional_engines = .*|optional_engines = []|' "$SRC" > "$CFG"
if [ -n "${MODEL:-}" ]; then
  sed -i -e "s|^model = .*|model = \"$(realpath "$MODEL")\"|" -e '/^make_model = /d' "$CFG"
fi
[ -n "${DTYPE:-}" ] && sed -i "s|^dtype = .*|dtype = \"$DTYPE\"|" "$CFG"
for e in "${!opts[@]}"; do
  if grep -q "^\[engine_options.$e\]" "$CFG"; then sed -i "/^\[engine_options.$e\]/a ${opts[$e]//\\/\\\\}" "$CFG"
  else printf '\n[engine_options.%s]\n%s\n' "$e" "${opts[$e]}" >> "$CFG"; fi
done

# The dry run first: every launch command, version and first request checked against the engines'
# own parsers and request models (or the tables recorded at the pinned tags) before any GPU minute.
"$PY" -m experiments.cli run "$CFG" --out "$OUT" --dry-run | tee "$OUT/dry_run.txt"; rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  echo "gpu_compare: the dry run failed (the lines above; $OUT/dry_run.txt): nothing was started" >&2
  exit "$rc"
fi
[ "$DRY" = 1 ] && { echo "config: $CFG (dry run: nothing started; $OUT/dry_run.txt)"; exit 0; }
"$PY" -m experiments.cli run "$CFG" --out "$OUT"; rc=$?
echo "report: $OUT/$NAME/report.md (engines: $OUT/engines.txt)"
exit $rc

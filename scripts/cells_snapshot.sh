#!/bin/bash
# Run cells of experiments/configs/cpu_vs_vllm.toml from a `git archive` snapshot of HEAD (so edits in the
# working tree cannot reach a server started mid-run: servers load the engine and its kernels from the tree),
# under the shared bench lock (flock /tmp/inferlab-bench.lock: one timing job at a time on this machine), at
# nice -10 against niced neighbours. Results: /tmp/cells/out-TAG/cpu_vs_vllm/.
# usage: scripts/cells_snapshot.sh TAG CELL [CELL ...]
set -e
TAG=$1; shift
REPO=$(cd "$(dirname "$0")/.." && pwd)
S=/tmp/snap-$TAG
rm -rf "$S"; mkdir -p "$S" /tmp/cells
git -C "$REPO" archive HEAD | tar -x -C "$S"
git -C "$REPO" rev-parse HEAD > "$S/COMMIT"  # the snapshot has no .git: manifests read `git None`
for d in models .venv .venv-vllm; do ln -s "$REPO/$d" "$S/$d"; done
cd "$S"
args=(); for c in "$@"; do args+=(--cell "$c"); done
echo "start $(date -u +%FT%TZ) commit $(cat COMMIT) load $(cut -d' ' -f1-3 /proc/loadavg)"
flock /tmp/inferlab-bench.lock nice -n -10 env PYTHONPATH="$S" .venv/bin/inferlab run \
  experiments/configs/cpu_vs_vllm.toml "${args[@]}" --out "/tmp/cells/out-$TAG" --no-progress
echo "end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"

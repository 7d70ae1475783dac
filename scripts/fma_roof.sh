#!/bin/bash
# This CPU's 512-bit FMA roof per core: 24 independent vfmadd231ps chains (no loads), 1e8 iterations,
# compiled and run in a temporary folder (docs/perf/2026-12-05-prefill-gemm.md). Needs AVX-512F.
set -e
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
body=$(for j in $(seq 0 23); do printf '"vfmadd231ps %%%%zmm30, %%%%zmm31, %%%%zmm%d\\n\\t"\n' "$j"; done)
cat > "$d/roof.cpp" <<CPP
#include <chrono>
#include <cstdio>
int main() {
  long n = 100000000; auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) __asm__ volatile($body ::: "memory");
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("%.1f GFLOP/s per core (%.3f G 512-bit FMAs/s)\n", n * 24.0 * 32 / s / 1e9, n * 24.0 / s / 1e9);
}
CPP
${CXX:-c++} -O2 -mavx512f "$d/roof.cpp" -o "$d/roof" && "$d/roof"

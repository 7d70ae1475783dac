// What every kernel shares, each defined once: the includes, the vector lanes (simd.h), the bf16 GEMMs'
// last step, the work-sharing loop and the profiler region.
#pragma once

// ATen's pieces, not <torch/extension.h>: a tenth of the compile time (only bindings.cpp needs Python)
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "simd.h"

// A named torch.profiler region around a kernel call: one thread-local check when no profiler runs.
#define PROFILE(name) RECORD_FUNCTION(name, c10::ArrayRef<const c10::IValue>{})

namespace inferlab {

// nc fp32 sums of one row, + bias, each rounded once to bf16 (round to nearest even, as at::BFloat16):
// every bf16 GEMM's last step
static inline void finish_bf16(const float* s, const float* b, int64_t nc, at::BFloat16* out) {
  int64_t j = 0;
#ifdef VEC8
  for (; j + 8 <= nc; j += 8) store8(out + j, _mm256_add_ps(load8(s + j), load8(b + j)));
#endif
  for (; j < nc; ++j) out[j] = at::BFloat16(s[j] + b[j]);
}

// Guided work sharing: items [0, n) go to `threads` workers in spans [a, b) grabbed from a shared
// counter, each (n - taken) / (2 threads) items rounded down to a multiple of `align` and at least
// `min_span`. Long early spans keep a prefetch streaming; the short last ones let a thread the OS
// took away for a while leave only its current span to the others' wait. Which thread computes an
// item never changes its result: every kernel's sums are fixed per output.
template <typename F>
static inline void share(int64_t n, int64_t threads, int64_t min_span, int64_t align, const F& work) {
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    int64_t a = next.load(std::memory_order_relaxed);
    while (a < n) {
      const int64_t size = std::min(n - a, std::max(min_span, (n - a) / (2 * threads) / align * align));
      if (!next.compare_exchange_weak(a, a + size, std::memory_order_relaxed)) continue;
      work(a, a + size);
      a = next.load(std::memory_order_relaxed);
    }
  });
}

}  // namespace inferlab

// What every kernel shares, each defined once: the includes, the 8-lane vector helpers (AVX2 + FMA,
// also under AVX-512), the bf16 rounding, the work-sharing loop and the profiler region.
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

// A named torch.profiler region around a kernel call: one thread-local check when no profiler runs.
#define PROFILE(name) RECORD_FUNCTION(name, c10::ArrayRef<const c10::IValue>{})

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VEC8 1  // 8-lane helpers below; the kernels keep a scalar path with the same sums where it can
#endif

namespace inferlab {

#ifdef VEC8
// fp32 -> bf16 bits, round to nearest even (what at::BFloat16's constructor does for finite values),
// left in the high half of each 32-bit lane: the one rounding every bf16 store and re-round uses.
static inline __m256i round_bf16(__m256 v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
}
static inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8(const at::BFloat16* p) {  // bf16 -> fp32: the 16 bits are the high half
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
static inline void store8(at::BFloat16* p, __m256 v) {
  const __m256i b = _mm256_srli_epi32(round_bf16(v), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}
// v rounded to the precision of T's elements and widened back (a no-op for float)
static inline __m256 rnd8(__m256 v, const float*) { return v; }
static inline __m256 rnd8(__m256 v, const at::BFloat16*) {
  return _mm256_castsi256_ps(_mm256_and_si256(round_bf16(v), _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
// lane r of the result = the sum of the 8 lanes of a[r]
static inline __m256 reduce8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}
// e^x for x <= 0 (Cephes' expf: exp(x) = 2^n e^r, |r| <= ln2/2, degree-5 polynomial; ~1 ulp)
static inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

#if defined(__AVX512F__)
#define VEC16 1  // 16-lane helpers (the AVX-512 build): the same per-lane operations as the 8-lane ones
static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const at::BFloat16* p) {  // bf16 -> fp32: the 16 bits are the high half
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline __m512i round_bf16(__m512 v) {  // round_bf16 above, 16 lanes
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
}
static inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
static inline void store16(at::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(round_bf16(v), 16)));
}
static inline __m512 rnd16(__m512 v, const float*) { return v; }
static inline __m512 rnd16(__m512 v, const at::BFloat16*) {
  return _mm512_castsi512_ps(_mm512_and_si512(round_bf16(v), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
// exp8 on 16 lanes: the same steps and constants, so the same value in every lane
static inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  __m512 n = _mm512_floor_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)));
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  for (const float c : {1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f})
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(c));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
// sigmoid(x) from e^-|x| (so exp16 only sees arguments <= 0): 1 / den for x >= 0, e^-|x| / den for x < 0,
// den = 1 + e^-|x|; x's sign picks the numerator, then one division. SiLU is x times it.
static inline __m512 sigmoid16(__m512 x) {
  const __m512 ex = exp16(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
  const __m512 one = _mm512_set1_ps(1.f), den = _mm512_add_ps(one, ex);
  const __mmask16 neg = _mm512_movepi32_mask(_mm512_castps_si512(x));  // x's sign bit (blendv's choice)
  return _mm512_div_ps(_mm512_mask_blend_ps(neg, one, ex), den);
}
#endif

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

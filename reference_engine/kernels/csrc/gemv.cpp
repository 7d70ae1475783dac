// The decode GEMV: a few rows of x against all of W (N, K) as nn.Linear stores it, as dot products
// (layout, rounding and scheduling: reference_engine/kernels/cpp_gemv.py).
#include "common.h"
#include "kernels.h"

namespace inferlab {

static constexpr int64_t MIN_CHUNK = 32;  // fewest rows of W per grab from the shared counter

#ifdef VEC8
#ifdef __AVX512F__
// 16 lanes; folded to 8 (lane i + lane i + 8) before reduce8's tree
typedef __m512 vec;
static constexpr int64_t L = 16;
static constexpr int NR4 = 4;  // 32 vector registers: a 4 x 4 tile
static constexpr int NR1 = 16;  // one row of x: 16 rows of W
static inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
static inline vec vzero() { return _mm512_setzero_ps(); }
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
// (extractf32x8 for the low half too: GCC 12's cast warns of an uninitialised value it never reads)
static inline __m256 fold(vec v) { return _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1)); }
#else
typedef __m256 vec;
static constexpr int64_t L = 8;
static constexpr int NR4 = 2;  // 16 registers
static constexpr int NR1 = 8;
static inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
static inline vec vzero() { return _mm256_setzero_ps(); }
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline __m256 fold(vec v) { return v; }
#endif

#ifndef PREFETCH
#define PREFETCH(p) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0)
#endif
// MR rows of x (ldx apart) against NR rows of W (K apart): y[m * ldy + n]
template <int MR, int NR, bool PF>
static inline void tile(const float* x, int64_t ldx, const float* w, int64_t K, float* y, int64_t ldy,
                        const float* pf) {
  constexpr int A = (MR * NR + 7) / 8 * 8;  // reduce8 takes 8 sums at a time; the rest stay 0
  vec acc[MR * NR];
  for (int i = 0; i < MR * NR; ++i) acc[i] = vzero();
  const int64_t KL = K - K % L;
  for (int64_t k = 0; k < KL; k += L) {
    vec xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = vload(x + m * ldx + k);
    for (int n = 0; n < NR; ++n) {
      if constexpr (PF) PREFETCH(pf + n * K + k);
      const vec wv = vload(w + n * K + k);
      for (int m = 0; m < MR; ++m) acc[m * NR + n] = vfma(xv[m], wv, acc[m * NR + n]);
    }
  }
  __m256 f[A];
  for (int i = 0; i < A; ++i) f[i] = i < MR * NR ? fold(acc[i]) : _mm256_setzero_ps();
  alignas(32) float s[A];
  for (int i = 0; i < A; i += 8) _mm256_store_ps(s + i, reduce8(f + i));
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) {
      float v = s[m * NR + n];
      for (int64_t k = KL; k < K; ++k) v = std::fma(x[m * ldx + k], w[n * K + k], v);
      y[m * ldy + n] = v;
    }
}
#else
static constexpr int NR4 = 2;
static constexpr int NR1 = 8;
// the same roundings without vectors: 8 lane sums, then reduce8's tree
template <int MR, int NR, bool PF>
static inline void tile(const float* x, int64_t ldx, const float* w, int64_t K, float* y, int64_t ldy,
                        const float* pf) {
  const int64_t K8 = K & ~int64_t(7);
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) {
      float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t k = 0; k < K8; k += 8)
        for (int l = 0; l < 8; ++l) p[l] = std::fma(x[m * ldx + k + l], w[n * K + k + l], p[l]);
      float v = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
      for (int64_t k = K8; k < K; ++k) v = std::fma(x[m * ldx + k], w[n * K + k], v);
      y[m * ldy + n] = v;
    }
}
#endif

// MR rows of x against one NR-row tile of W, all of x's rows while the tile is in L1: the next
// tile's prefetch stays in flight while the later row groups compute
template <int NR, bool PF>
static inline void rows(const float* x, int64_t ldx, int64_t M, const float* w, int64_t K, float* y, int64_t ldy,
                        const float* pf) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<4, NR, PF>(x + m * ldx, ldx, w, K, y + m * ldy, ldy, pf);
  for (; m + 2 <= M; m += 2) tile<2, NR, PF>(x + m * ldx, ldx, w, K, y + m * ldy, ldy, pf);
  for (; m < M; ++m) tile<1, NR, PF>(x + m * ldx, ldx, w, K, y + m * ldy, ldy, pf);
}

// rows [n0, n1) of W: tiles of NR rows, then one row at a time
template <int NR, bool PF>
static void span(const float* x, int64_t ldx, int64_t M, const float* w, int64_t K, float* y, int64_t ldy,
                 int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) {
    const float* pf = w + std::min(n + NR, n1 - NR) * K;  // the next tile of this span (the last: itself)
    rows<NR, PF>(x, ldx, M, w + n * K, K, y + n, ldy, pf);
  }
  for (; n < n1; ++n) rows<1, PF>(x, ldx, M, w + n * K, K, y + n, ldy, w + n * K);
}

at::Tensor gemv(at::Tensor x, at::Tensor w, at::Tensor bias) {
  PROFILE("inferlab::gemv");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.scalar_type() == at::kFloat, "gemv: x (M, K) float32 rows");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kFloat && w.size(1) == x.size(1),
              "gemv: W (N, K) float32, contiguous");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0), ldx = x.stride(0);
  auto y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), N / MIN_CHUNK));
  share(N, nt, MIN_CHUNK, 8, [&](int64_t n0, int64_t n1) {
    if (M == 1) span<NR1, false>(xp, ldx, M, wp, K, yp, N, n0, n1);
    else if (M < 4) span<4, true>(xp, ldx, M, wp, K, yp, N, n0, n1);
    else span<NR4, true>(xp, ldx, M, wp, K, yp, N, n0, n1);
  });
  if (bias.numel()) y.add_(bias);
  return y;
}

}  // namespace inferlab

// The GEMM on W's 32-column k-major panels (layout and rounding: reference_engine/kernels/cpp_gemm.py).
#include "common.h"
#include "kernels.h"

namespace inferlab {

#ifdef __AVX512F__
static constexpr int NV = 2, NR = 32, MR = 12;  // 24 accumulators + 2 panel vectors + a broadcast

static constexpr int64_t KB = 256;  // k per pass: a panel's slice (KB x NR floats, 32 KB) stays in L1
static constexpr int64_t MB = 252;  // rows per pass over W (21 tiles): more than MID_M, so one pass there

// rows [0, R) of x (ldx apart) against k in [k0, k1) of one panel: y[m * ldy + j] for j < nc, starting
// from 0 at k0 == 0 and from y's partial sums after (a store and a load are exact: the same roundings)
template <int R, bool PF>
static inline void tile(const float* x, int64_t ldx, const float* p, int64_t k0, int64_t k1, float* y,
                        int64_t ldy, int64_t nc, const float* pf) {
  const __mmask16 lo = nc >= 16 ? 0xffff : (__mmask16)((1u << nc) - 1);
  const __mmask16 hi = nc >= 32 ? 0xffff : nc <= 16 ? 0 : (__mmask16)((1u << (nc - 16)) - 1);
  __m512 a[R][NV];
  for (int m = 0; m < R; ++m) {
    a[m][0] = k0 ? _mm512_maskz_loadu_ps(lo, y + m * ldy) : _mm512_setzero_ps();
    a[m][1] = k0 ? _mm512_maskz_loadu_ps(hi, y + m * ldy + 16) : _mm512_setzero_ps();
  }
  for (int64_t k = k0; k < k1; ++k) {
    const float* q = p + k * NR;
    if constexpr (PF) {
      _mm_prefetch(reinterpret_cast<const char*>(pf + (k - k0) * NR), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(pf + (k - k0) * NR + 16), _MM_HINT_T0);
    }
    const __m512 w0 = _mm512_loadu_ps(q), w1 = _mm512_loadu_ps(q + 16);
    for (int m = 0; m < R; ++m) {
      const __m512 b = _mm512_set1_ps(x[m * ldx + k]);
      a[m][0] = _mm512_fmadd_ps(b, w0, a[m][0]);
      a[m][1] = _mm512_fmadd_ps(b, w1, a[m][1]);
    }
  }
  for (int m = 0; m < R; ++m) {
    _mm512_mask_storeu_ps(y + m * ldy, lo, a[m][0]);
    _mm512_mask_storeu_ps(y + m * ldy + 16, hi, a[m][1]);
  }
}

// the last R < MR rows: pick the tile size at run time
template <int R>
static inline void tail(const float* x, int64_t ldx, int64_t r, const float* p, int64_t k0, int64_t k1, float* y,
                        int64_t ldy, int64_t nc, const float* pf, bool first) {
  if constexpr (R > 0) {
    if (r != R) return tail<R - 1>(x, ldx, r, p, k0, k1, y, ldy, nc, pf, first);
    if (first) tile<R, true>(x, ldx, p, k0, k1, y, ldy, nc, pf);
    else tile<R, false>(x, ldx, p, k0, k1, y, ldy, nc, pf);
  }
}

// all M rows of x against one panel, KB of k at a time; the first row group of each slice prefetches
// the next slice (of this panel, or the first of `next`, the following panel)
static void panel(const float* x, int64_t ldx, int64_t M, const float* p, int64_t K, float* y, int64_t ldy,
                  int64_t nc, const float* next) {
  for (int64_t k0 = 0; k0 < K; k0 += KB) {
    const int64_t k1 = std::min(K, k0 + KB);
    const float* pf = k1 < K ? p + k1 * NR : next;
    int64_t m = 0;
    for (; m + MR <= M; m += MR) {
      if (m == 0) tile<MR, true>(x, ldx, p, k0, k1, y, ldy, nc, pf);
      else tile<MR, false>(x + m * ldx, ldx, p, k0, k1, y + m * ldy, ldy, nc, pf);
    }
    if (m < M) tail<MR - 1>(x + m * ldx, ldx, M - m, p, k0, k1, y + m * ldy, ldy, nc, pf, m == 0);
  }
}

at::Tensor gemm(at::Tensor x, at::Tensor packed, int64_t N, at::Tensor bias) {
  PROFILE("inferlab::gemm");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.scalar_type() == at::kFloat, "gemm: x (M, K) float32 rows");
  TORCH_CHECK(packed.dim() == 3 && packed.is_contiguous() && packed.scalar_type() == at::kFloat &&
              packed.size(2) == NR && packed.size(1) == x.size(1) && packed.size(0) * NR >= N,
              "gemm: packed (P, K, 32) float32 from pack()");
  const int64_t M = x.size(0), K = x.size(1), ldx = x.stride(0), P = (N + NR - 1) / NR;
  auto y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* pp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), P));
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    const int64_t rows = std::min(MB, M - m0);
    share(P, nt, 1, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t q = p0; q < p1; ++q) {
        const float* pf = pp + std::min(q + 1, p1 - 1) * K * NR;  // this span's next panel
        panel(xp + m0 * ldx, ldx, rows, pp + q * K * NR, K, yp + m0 * N + q * NR, N,
              std::min<int64_t>(NR, N - q * NR), pf);
      }
    });
  }
  if (bias.numel()) y.add_(bias);
  return y;
}
#else
at::Tensor gemm(at::Tensor, at::Tensor, int64_t, at::Tensor) {
  TORCH_CHECK(false, "gemm: built without AVX-512");
}
#endif

}  // namespace inferlab

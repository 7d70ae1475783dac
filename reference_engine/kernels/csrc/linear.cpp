// y = x @ W.T (+ bias) on W's 32-column k-major panels (P, K, NR), packed[p, k, j] = W[p * NR + j, k],
// zero past N (layout, rounding and why: reference_engine/kernels/cpp_gemm.py). It serves any row count. Every output is one fixed sequence of roundings,
//   y[m, n] = fma(x[m, K-1], W[n, K-1], ... fma(x[m, 0], W[n, 0], 0)),   then + bias,
// whatever the row count, the tile, the thread or the ISA (AVX-512, AVX2 + FMA, scalar std::fma).
// bf16 panels go to linear_bf16.cpp.
#include "common.h"
#include "kernels.h"

namespace inferlab {

static constexpr int64_t NR = 32;   // output columns per panel
static constexpr int64_t KB = 128;  // k per pass: a panel's slice (16 KB) and a row tile's x stay in L1
static constexpr int64_t MB = 240;  // rows per pass over W: a multiple of every MR

// NR columns of one row as NV vectors of W lanes: zero, load, broadcast, fma, store
#if defined(__AVX512F__)
struct Lanes {
  static constexpr int W = 16, MR = 12;  // 24 accumulators + 2 panel vectors + a broadcast: 27 of 32
  using T = __m512;
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T bcast(float v) { return _mm512_set1_ps(v); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
};
#elif defined(VEC8)
struct Lanes {
  static constexpr int W = 8, MR = 3;  // 12 accumulators + 1 panel vector + 3 broadcasts: 16 of 16
  using T = __m256;
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T bcast(float v) { return _mm256_set1_ps(v); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
};
#else
struct Lanes {  // scalar: std::fma rounds once, as the vector FMAs do
  static constexpr int W = 1, MR = 4;
  using T = float;
  static T zero() { return 0.f; }
  static T load(const float* p) { return *p; }
  static void store(float* p, T v) { *p = v; }
  static T bcast(float v) { return v; }
  static T fma(T a, T b, T c) { return std::fma(a, b, c); }
};
#endif
static constexpr int NV = NR / Lanes::W, MR = Lanes::MR;
static_assert(MB % MR == 0, "MB: whole row tiles");

static inline void prefetch_slice(const float* p, int64_t k) {  // one k step of a panel: 128 bytes
  __builtin_prefetch(p + k * NR);
  __builtin_prefetch(p + k * NR + 16);
}

// R rows of x (ldx apart) against k in [k0, k1) of one panel p: c (R, NR) starts from 0 at k0 == 0 and
// from its partial sums after (a store and a load round nothing). With PF, prefetch the slice pf.
template <int R, bool PF>
static inline void tile(const float* x, int64_t ldx, const float* p, int64_t k0, int64_t k1, float* c,
                        const float* pf) {
  using L = Lanes;
  typename L::T a[R][NV];
  for (int m = 0; m < R; ++m)
    for (int j = 0; j < NV; ++j) a[m][j] = k0 ? L::load(c + m * NR + j * L::W) : L::zero();
  for (int64_t k = k0; k < k1; ++k) {
    const float* q = p + k * NR;
    if constexpr (PF) prefetch_slice(pf, k - k0);
    if constexpr (NV <= 2) {  // the panel's vectors in registers, each row's broadcast used NV times
      typename L::T w[NV];
      for (int j = 0; j < NV; ++j) w[j] = L::load(q + j * L::W);
      for (int m = 0; m < R; ++m) {
        const typename L::T b = L::bcast(x[m * ldx + k]);
        for (int j = 0; j < NV; ++j) a[m][j] = L::fma(b, w[j], a[m][j]);
      }
    } else {  // the rows' broadcasts in registers, each panel vector used R times
      typename L::T b[R];
      for (int m = 0; m < R; ++m) b[m] = L::bcast(x[m * ldx + k]);
      for (int j = 0; j < NV; ++j) {
        const typename L::T w = L::load(q + j * L::W);
        for (int m = 0; m < R; ++m) a[m][j] = L::fma(b[m], w, a[m][j]);
      }
    }
  }
  for (int m = 0; m < R; ++m)
    for (int j = 0; j < NV; ++j) L::store(c + m * NR + j * L::W, a[m][j]);
}

// the last r < MR rows: the tile size picked at run time
template <int R>
static inline void tail(const float* x, int64_t ldx, int64_t r, const float* p, int64_t k0, int64_t k1, float* c,
                        const float* pf, bool first) {
  if constexpr (R > 0) {
    if (r != R) return tail<R - 1>(x, ldx, r, p, k0, k1, c, pf, first);
    if (first) tile<R, true>(x, ldx, p, k0, k1, c, pf);
    else tile<R, false>(x, ldx, p, k0, k1, c, pf);
  }
}

// M rows of x against one panel, KB of k at a time, into c (M, NR); the first row tile of each slice
// prefetches the next slice (of this panel, or the first of `next`)
static void panel(const float* x, int64_t ldx, int64_t M, const float* p, int64_t K, float* c, const float* next) {
  for (int64_t k0 = 0; k0 < K; k0 += KB) {
    const int64_t k1 = std::min(K, k0 + KB);
    const float* pf = k1 < K ? p + k1 * NR : next;
    int64_t m = 0;
    for (; m + MR <= M; m += MR) {
      if (m == 0) tile<MR, true>(x, ldx, p, k0, k1, c, pf);
      else tile<MR, false>(x + m * ldx, ldx, p, k0, k1, c + m * NR, pf);
    }
    if (m < M) tail<MR - 1>(x + m * ldx, ldx, M - m, p, k0, k1, c + m * NR, pf, m == 0);
  }
}

at::Tensor linear(at::Tensor x, at::Tensor packed, int64_t N, at::Tensor bias) {
  if (packed.scalar_type() == at::kBFloat16) return linear_bf16(x, packed, N, bias, true);  // bf16 pair panels
  PROFILE("inferlab::linear");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.scalar_type() == at::kFloat, "linear: x (M, K) float32 rows");
  TORCH_CHECK(packed.dim() == 3 && packed.is_contiguous() && packed.scalar_type() == at::kFloat &&
              packed.size(2) == NR && packed.size(1) == x.size(1) && packed.size(0) * NR >= N,
              "linear: packed (P, K, 32) float32 from pack()");
  const int64_t M = x.size(0), K = x.size(1), ldx = x.stride(0), P = (N + NR - 1) / NR;
  auto y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* pp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), P));
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    const int64_t rows = std::min(MB, M - m0);
    share(P, nt, 1, 1, [&](int64_t p0, int64_t p1) {
      std::vector<float> c(rows * NR);  // the panel's outputs: whole vectors, copied to y's nc columns
      for (int64_t q = p0; q < p1; ++q) {
        panel(xp + m0 * ldx, ldx, rows, pp + q * K * NR, K, c.data(), pp + std::min(q + 1, p1 - 1) * K * NR);
        const int64_t nc = std::min(NR, N - q * NR);
        for (int64_t m = 0; m < rows; ++m) std::copy_n(c.data() + m * NR, nc, yp + (m0 + m) * N + q * NR);
      }
    });
  }
  if (bias.numel()) y.add_(bias);
  return y;
}

}  // namespace inferlab

// y = x @ W.T (+ bias) for bf16 x and W's bf16 pair panels (P, K/2, NR, 2), packed[p, i, j, t] =
// W[p * NR + j, 2 i + t], zero past N and past an odd K (layout and why: reference_engine/kernels/cpp_gemm.py).
// Every output is one fixed sequence of roundings, the order of AVX512_BF16's vdpbf16ps (Intel SDM:
// acc += x[2i+1] * w[2i+1], then acc += x[2i] * w[2i]; each product of two bf16 is exact in fp32):
//   acc = fma(x[1], W[1], 0); acc = fma(x[0], W[0], acc); acc = fma(x[3], W[3], acc); ...
// then + bias in fp32 and one rounding to bf16. AVX512_BF16 runs vdpbf16ps itself; AVX-512 without it,
// AVX2 and scalar widen each pair to fp32 (a 16-bit shift, exact) and run the two FMAs: the same bits,
// except where vdpbf16ps flushes denormal inputs or sums to zero (|v| < 2^-126; not in the test data).
#include <omp.h>

#include <cstring>
#include <memory>

#include <ATen/ops/constant_pad_nd.h>

#include "amx.h"
#include "kernels.h"

namespace inferlab {

static constexpr int64_t NR = 32;    // output columns per panel
static constexpr int64_t XB = 1 << 17;  // pairs of packed x per pass over W (512 KB): they stay in L2
static constexpr int64_t RS = 48;       // rows per work item: a multiple of every MR

static inline uint32_t pair_at(const uint32_t* p) {  // x's rows may start on any 2-byte boundary
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The pair step (simd.h) with its register tile: NP adjacent panels x MR rows of accumulators
template <class S, int NP_, int MR_>
struct Tiled : S {
  static constexpr int NP = NP_, MR = MR_;
};
#if defined(__AVX512F__)
using Native = Tiled<Dp, 2, 6>;  // vdpbf16ps, two panels, 6 rows: 24 accumulators, 4 panel vectors, a broadcast
#endif
// widening FMAs: AVX-512 6 rows of one panel; AVX2 2 (8 accumulators + 2 broadcast pairs + a widened weight
// pair); scalar 4
using Wide = Tiled<Widen<Widest>, 1, Widest::W == 16 ? 6 : Widest::W == 8 ? 2 : 4>;

// R rows of packed x (K2, R) against all K2 pairs of NP adjacent panels (p, p + ps, ...) in one pass, into
// c (R, NP * NR); with PF, prefetch the panels at pf (and pf + ps, ...) as it goes. x packed k-major (as the
// fp32 kernel's, linear.cpp): every broadcast from one stream, no partial sums leaving the registers.
template <class O, int NP, int R, bool PF>
#if defined(__AVX512F__)
BF16_TARGET  // O's functions are inlined into this one
#endif
static void tile(const uint32_t* x, const uint32_t* p, int64_t ps, int64_t K2, float* c, const uint32_t* pf) {
  constexpr int NV = NR / O::W, V = NP * NV, CW = NP * NR;
  typename O::Acc a[R][V];
  for (int m = 0; m < R; ++m)
    for (int j = 0; j < V; ++j) a[m][j] = O::zero();
  for (int64_t k = 0; k < K2; ++k, x += R) {
    const uint32_t* q = p + k * NR;
    if constexpr (PF) {  // one pair step of each panel: 128 bytes
      for (int n = 0; n < NP; ++n) {
        __builtin_prefetch(pf + n * ps + k * NR);
        __builtin_prefetch(pf + n * ps + k * NR + 16);
      }
    }
    if constexpr (V <= 4) {  // the panels' vectors in registers, each row's broadcast used V times
      typename O::Wv w[V];
      for (int j = 0; j < V; ++j) w[j] = O::loadw(q + (j / NV) * ps + (j % NV) * O::W);
      for (int m = 0; m < R; ++m) {
        const typename O::Xb b = O::bcast(x[m]);
        for (int j = 0; j < V; ++j) a[m][j] = O::step(a[m][j], b, w[j]);
      }
    } else {  // the rows' broadcasts in registers, each panel vector used R times
      typename O::Xb b[R];
      for (int m = 0; m < R; ++m) b[m] = O::bcast(x[m]);
      for (int j = 0; j < V; ++j) {
        const typename O::Wv w = O::loadw(q + (j / NV) * ps + (j % NV) * O::W);
        for (int m = 0; m < R; ++m) a[m][j] = O::step(a[m][j], b[m], w);
      }
    }
  }
  for (int m = 0; m < R; ++m)
    for (int j = 0; j < V; ++j) O::store(c + m * CW + j * O::W, a[m][j]);
}

template <class O, int NP, int R>  // the last r < MR rows: the tile size picked at run time
static void tail(const uint32_t* x, int64_t r, const uint32_t* p, int64_t ps, int64_t K2, float* c,
                 const uint32_t* pf, bool first) {
  if constexpr (R > 0) {
    if (r != R) return tail<O, NP, R - 1>(x, r, p, ps, K2, c, pf, first);
    if (first) tile<O, NP, R, true>(x, p, ps, K2, c, pf);
    else tile<O, NP, R, false>(x, p, ps, K2, c, pf);
  }
}

// M packed rows against NP adjacent panels into c (M, NP * NR); the first row tile prefetches `next`
template <class O, int NP>
static void panels(const uint32_t* xa, int64_t M, const uint32_t* p, int64_t K2, float* c, const uint32_t* next) {
  const int64_t ps = K2 * NR, CW = NP * NR;
  int64_t m = 0;
  for (; m + O::MR <= M; m += O::MR) {
    if (m == 0) tile<O, NP, O::MR, true>(xa, p, ps, K2, c, next);
    else tile<O, NP, O::MR, false>(xa + m * K2, p, ps, K2, c + m * CW, next);
  }
  if (m < M) tail<O, NP, O::MR - 1>(xa + m * K2, M - m, p, ps, K2, c + m * CW, next, m == 0);
}

// rows [0, M) of x (ldx pairs apart) -> xa: row tile t (rows t MR ..) as (K2, r) k-major pairs, r = its
// row count (MR, or fewer in the last), at xa + t MR K2
static void pack_rows(const uint32_t* x, int64_t ldx, int64_t M, int64_t K2, int64_t MR, uint32_t* xa, int64_t t0,
                      int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t m0 = t * MR, r = std::min<int64_t>(MR, M - m0);
    uint32_t* d = xa + m0 * K2;
    for (int64_t k = 0; k < K2; ++k)
      for (int64_t i = 0; i < r; ++i) d[k * r + i] = pair_at(x + (m0 + i) * ldx + k);
  }
}

// Per block of rows (as many as XB holds, whole work items): x packed, then work items (group of NP panels,
// RS rows), group-major: threads split the rows as well as the panels (an odd number of groups no longer
// leaves one thread a group behind), and a thread's consecutive items reuse one group's panels from cache.
// One block (a decode step, a short prefill) or one thread: a parallel region per block, items in guided
// spans. Many blocks (a prefill) on many threads: one region for the whole call, as the fp32 GEMM does
// (linear.cpp): each block's items split evenly, the next block packed into the other buffer meanwhile,
// one barrier per block. Which thread computes an item never changes its sums.
template <class O>
static void run(const uint32_t* xp, int64_t ldx, int64_t M, const uint32_t* pp, int64_t K2, int64_t N,
                const at::BFloat16* bias, at::BFloat16* yp) {
  constexpr int64_t NP = O::NP, CW = NP * NR;
  const int64_t P = (N + NR - 1) / NR, G = (P + NP - 1) / NP;  // G groups of NP panels (the last maybe fewer)
  const int64_t MB = std::max<int64_t>(1, XB / K2 / RS) * RS, threads = std::max(1, at::get_num_threads());
  // item i of the block of `rows` rows at m0, x packed in xa; c: the item's fp32 sums (RS * CW)
  auto item = [&](int64_t i, int64_t m0, int64_t rows, const uint32_t* xa, float* c) {
    const int64_t R = (rows + RS - 1) / RS, g = i / R, r0 = (i % R) * RS, nr = std::min(RS, rows - r0);
    const int64_t q = g * NP, n0 = q * NR, nc = std::min(CW, N - n0);
    const uint32_t* x = xa + r0 * K2;
    const uint32_t* next = pp + std::min(g + 1, G - 1) * NP * K2 * NR;
    const bool whole = q + NP <= P;
    if (whole) panels<O, NP>(x, nr, pp + q * K2 * NR, K2, c, next);
    else panels<O, 1>(x, nr, pp + q * K2 * NR, K2, c, next);
    const int64_t cw = whole ? CW : NR;  // the row stride panels<> wrote
    float b[CW] = {};
    if (bias)
      for (int64_t j = 0; j < nc; ++j) b[j] = static_cast<float>(bias[n0 + j]);
    for (int64_t m = 0; m < nr; ++m) finish_bf16(c + m * cw, b, nc, yp + (m0 + r0 + m) * N + n0);
  };
  if (M <= MB || threads == 1) {
    const std::unique_ptr<uint32_t[]> xa(new uint32_t[std::min(M, MB) * K2]);  // uninitialised: no zero fill
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
      const int64_t rows = std::min(MB, M - m0), items = G * ((rows + RS - 1) / RS);
      const int64_t tiles = (rows + O::MR - 1) / O::MR;
      if (rows * K2 < (1 << 15))  // a decode step's few rows: no parallel region for a copy of microseconds
        pack_rows(xp + m0 * ldx, ldx, rows, K2, O::MR, xa.get(), 0, tiles);
      else
        share(tiles, threads, 1, 1,
              [&](int64_t t0, int64_t t1) { pack_rows(xp + m0 * ldx, ldx, rows, K2, O::MR, xa.get(), t0, t1); });
      share(items, std::min(threads, items), 1, 1, [&](int64_t i0, int64_t i1) {
        std::vector<float> c(RS * CW);
        for (int64_t i = i0; i < i1; ++i) item(i, m0, rows, xa.get(), c.data());
      });
    }
    return;
  }
  const std::unique_ptr<uint32_t[]> buf(new uint32_t[2 * MB * K2]);
  uint32_t* xa[2] = {buf.get(), buf.get() + MB * K2};
  const int64_t nb = (M + MB - 1) / MB;
#pragma omp parallel num_threads(threads)
  {
    const int64_t id = omp_get_thread_num(), T = omp_get_num_threads();
    auto pack = [&](int64_t b) {  // this thread's share of block b's row tiles
      const int64_t m0 = b * MB, rows = std::min(MB, M - m0), tiles = (rows + O::MR - 1) / O::MR;
      pack_rows(xp + m0 * ldx, ldx, rows, K2, O::MR, xa[b % 2], tiles * id / T, tiles * (id + 1) / T);
    };
    std::vector<float> c(RS * CW);
    pack(0);
#pragma omp barrier
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t m0 = b * MB, rows = std::min(MB, M - m0), items = G * ((rows + RS - 1) / RS);
      for (int64_t i = items * id / T; i < items * (id + 1) / T; ++i) item(i, m0, rows, xa[b % 2], c.data());
      if (b + 1 < nb) pack(b + 1);  // into the buffer no thread reads any more (block b - 1's)
#pragma omp barrier
    }
  }
}

bool bf16_native() {  // vdpbf16ps in this build and on this CPU
#if defined(__AVX512F__)
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

// path: AMX (2) where amx_ready() and K is a multiple of 32 (linear_amx.cpp), else vdpbf16ps (1) where
// bf16_native(), else the widening FMAs (0); a lower path asks for a lower one at most
at::Tensor linear_bf16(at::Tensor x, at::Tensor packed, int64_t N, at::Tensor bias, int64_t path) {
  PROFILE("inferlab::linear");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.scalar_type() == at::kBFloat16, "linear: x (M, K) bfloat16 rows");
  const int64_t M = x.size(0), K = x.size(1), K2 = (K + 1) / 2;
  TORCH_CHECK(packed.dim() == 4 && packed.is_contiguous() && packed.scalar_type() == at::kBFloat16 &&
              packed.size(2) == NR && packed.size(3) == 2 && packed.size(1) == K2 && packed.size(0) * NR >= N,
              "linear: packed (P, K/2, 32, 2) bfloat16 from pack()");
  TORCH_CHECK(!bias.numel() || (bias.numel() == N && bias.scalar_type() == at::kBFloat16 && bias.is_contiguous()),
              "linear: bias (N,) bfloat16");
  if (K % 2) x = at::constant_pad_nd(x, {0, 1}, 0);  // whole pairs in every row, the pad times W's zero
  else if (x.stride(0) % 2) x = x.contiguous();
  auto y = at::empty({M, N}, x.options());
  if (!M) return y;
  const at::BFloat16* bp = bias.numel() ? bias.data_ptr<at::BFloat16>() : nullptr;
  if (path >= 2 && K % 32 == 0 && amx_ready()) {
    linear_amx(x.data_ptr<at::BFloat16>(), x.stride(0), M, packed.data_ptr<at::BFloat16>(), K2, N, bp,
               y.data_ptr<at::BFloat16>(), false);
    return y;
  }
  const auto* xp = reinterpret_cast<const uint32_t*>(x.data_ptr<at::BFloat16>());
  const auto* pp = reinterpret_cast<const uint32_t*>(packed.data_ptr<at::BFloat16>());
  const int64_t ldx = x.stride(0) / 2;
#if defined(__AVX512F__)
  if (path >= 1 && bf16_native()) {
    run<Native>(xp, ldx, M, pp, K2, N, bp, y.data_ptr<at::BFloat16>());
    return y;
  }
#endif
  run<Wide>(xp, ldx, M, pp, K2, N, bp, y.data_ptr<at::BFloat16>());
  return y;
}

// silu(x @ Wg.T) * (x @ Wu.T) for W = [Wg; Wu] (N = 2 I rows) on its pair panels, on AMX: the GEMM's
// epilogue does SiLU-and-multiply (linear_amx.cpp), so the (M, 2 I) product is never written. The same bits
// as linear_bf16's AMX path followed by silu_mul. Where AMX runs, K % 32 == 0 and I % 32 == 0.
at::Tensor linear_silu(at::Tensor x, at::Tensor packed, int64_t N) {
  PROFILE("inferlab::linear_silu");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.scalar_type() == at::kBFloat16, "linear_silu: x (M, K) bfloat16 rows");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(amx_ready() && K % 32 == 0 && N % 64 == 0, "linear_silu: AMX, K and N / 2 multiples of 32");
  TORCH_CHECK(packed.dim() == 4 && packed.is_contiguous() && packed.scalar_type() == at::kBFloat16 &&
              packed.size(2) == NR && packed.size(1) == K / 2 && packed.size(0) * NR == N,
              "linear_silu: packed (P, K/2, 32, 2) bfloat16 from pack() of the stacked gate and up");
  if (x.stride(0) % 2) x = x.contiguous();
  auto y = at::empty({M, N / 2}, x.options());
  if (M)
    linear_amx(x.data_ptr<at::BFloat16>(), x.stride(0), M, packed.data_ptr<at::BFloat16>(), K / 2, N, nullptr,
               y.data_ptr<at::BFloat16>(), true);
  return y;
}

}  // namespace inferlab

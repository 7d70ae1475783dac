// y = x @ W.T (+ bias) on W's 32-column k-major panels (P, K, NR), packed[p, k, j] = W[p * NR + j, k],
// zero past N (layout, rounding and why: reference_engine/kernels/cpp_gemm.py). It serves any row count. Every output is one fixed sequence of roundings,
//   y[m, n] = fma(x[m, K-1], W[n, K-1], ... fma(x[m, 0], W[n, 0], 0)),   then + bias,
// whatever the row count, the tile, the thread or the ISA (AVX-512, AVX2 + FMA, scalar std::fma).
// bf16 panels go to linear_bf16.cpp.
#include <omp.h>

#include "common.h"
#include "kernels.h"

namespace inferlab {

static constexpr int64_t NR = 32;   // output columns per panel
static constexpr int64_t XB = 1 << 17;  // floats of packed x per pass over W (512 KB): they stay in L2

// NR columns of one row as NV vectors of the widest lanes (simd.h); rows per register tile: AVX-512 12 (24
// accumulators + 2 panel vectors + a broadcast: 27 of 32 registers), AVX2 3 (12 + 1 + 3: 16 of 16), scalar 4
static constexpr int NV = NR / Widest::W, MR = Widest::W == 16 ? 12 : Widest::W == 8 ? 3 : 4;

// one k step of NP adjacent panels (NP x 128 bytes, contiguous: panels are adjacent in memory)
template <int NP>
static inline void prefetch_slice(const float* p, int64_t k) {
  for (int i = 0; i < 2 * NP; ++i) __builtin_prefetch(p + k * NP * NR + i * 16);
}

// Which k steps of the next panels a row tile prefetches: `n` slices from `pf`, one every `every` k steps.
// The T row tiles of a panel each take 1/T of the next panel, so the stream from memory runs through the
// whole panel's time instead of crowding (and slowing) its first tile.
struct Prefetch {
  const float* pf;
  int64_t n, every;
};

// R rows of packed x (K, R) against NP adjacent panels p (NP, K, NR), all of k in one pass, into c (R rows,
// ldc apart; the panels' columns side by side). x packed k-major, the R values of one k side by side, so
// every broadcast comes from one stream at a fixed offset (no row pointer per row), and no partial sums
// leave the registers: measured 1.10x the row-major x with k in L1-sized slices
// (docs/perf/2026-12-05-prefill-gemm.md).
template <int NP, int R>
static inline void tile(const float* x, const float* p, int64_t K, float* c, int64_t ldc, Prefetch f) {
  using L = Widest;
  constexpr int V = NP * NV;
  typename L::T a[R][V];
  for (int m = 0; m < R; ++m)
    for (int j = 0; j < V; ++j) a[m][j] = L::zero();
  int64_t due = 0, done = 0;
  for (int64_t k = 0; k < K; ++k, x += R) {
    if (k == due && done < f.n) {
      prefetch_slice<NP>(f.pf, done++);
      due += f.every;
    }
    if constexpr (V <= 4) {  // the panels' vectors in registers, each row's broadcast used V times
      typename L::T w[V];
      for (int n = 0; n < NP; ++n)
        for (int j = 0; j < NV; ++j) w[n * NV + j] = L::load(p + n * K * NR + k * NR + j * L::W);
      for (int m = 0; m < R; ++m) {
        const typename L::T b = L::set1(x[m]);
        for (int j = 0; j < V; ++j) a[m][j] = L::fma(b, w[j], a[m][j]);
      }
    } else {  // the rows' broadcasts in registers, each panel vector used R times
      typename L::T b[R];
      for (int m = 0; m < R; ++m) b[m] = L::set1(x[m]);
      for (int j = 0; j < V; ++j) {
        const typename L::T w = L::load(p + (j / NV) * K * NR + k * NR + (j % NV) * L::W);
        for (int m = 0; m < R; ++m) a[m][j] = L::fma(b[m], w, a[m][j]);
      }
    }
  }
  for (int m = 0; m < R; ++m)
    for (int j = 0; j < V; ++j) L::store(c + m * ldc + j * L::W, a[m][j]);
}

// the last r < R rows: the tile size picked at run time
template <int NP, int R>
static inline void tail(const float* x, int64_t r, const float* p, int64_t K, float* c, int64_t ldc, Prefetch f) {
  if constexpr (R > 0) {
    if (r != R) return tail<NP, R - 1>(x, r, p, K, c, ldc, f);
    tile<NP, R>(x, p, K, c, ldc, f);
  }
}

// rows [0, M) of x (ldx apart) -> xa: row tile t (rows t mr ..) as (K, r) k-major, r = its row count
// (mr, or fewer in the last), at xa + t mr K
static void pack_rows(const float* x, int64_t ldx, int64_t M, int64_t K, float* xa, int64_t t0, int64_t t1,
                      int64_t mr) {
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t m0 = t * mr, r = std::min<int64_t>(mr, M - m0);
    float* d = xa + m0 * K;
    for (int64_t k = 0; k < K; ++k)
      for (int64_t i = 0; i < r; ++i) d[k * r + i] = x[(m0 + i) * ldx + k];
  }
}

// M packed rows (tiles of RT rows) against NP adjacent panels into c (M, ldc); the row tiles prefetch
// `next` (the next NP panels) a share each
template <int NP, int RT>
static void panel(const float* xa, int64_t M, const float* p, int64_t K, float* c, int64_t ldc, const float* next) {
  const int64_t T = (M + RT - 1) / RT, share = (K + T - 1) / T;
  int64_t m = 0, t = 0;
  auto part = [&](int64_t t) {  // tile t's share of the next panels' K slices
    const int64_t k0 = std::min(K, t * share);
    return Prefetch{next + k0 * NP * NR, std::min(share, K - k0), T};
  };
  for (; m + RT <= M; m += RT, ++t) tile<NP, RT>(xa + m * K, p, K, c + m * ldc, ldc, part(t));
  if (m < M) tail<NP, RT - 1>(xa + m * K, M - m, p, K, c + m * ldc, ldc, part(t));
}

at::Tensor linear(at::Tensor x, at::Tensor packed, int64_t N, at::Tensor bias) {
  if (packed.scalar_type() == at::kBFloat16) return linear_bf16(x, packed, N, bias, 2);  // bf16 pair panels, best path
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
  const int64_t MB = std::max<int64_t>(1, XB / K / MR) * MR;  // rows per pass over W: whole row tiles
  // A prefill (many rows) in 6-row tiles against 2 panels, 10 loads per 24 FMAs instead of 14: measured 1.04-1.06x
  // the 12 x 1 tile at 256-2048 rows, and 0.93-1.0x at 64 (docs/perf/2026-12-05-gemm-tiles.md). AVX-512 only: the
  // AVX2 tile is 3 rows x 4 vectors already.
  const bool wide = NV == 2 && M >= 192;
  const int64_t mr = wide ? MR / 2 : MR;  // x's row tiles
  // rows [m0, m0 + rows) packed into xa, then against panels [p0, p1)
  auto block = [&](int64_t m0, int64_t rows, float* xa, int64_t p0, int64_t p1, std::vector<float>& c) {
    int64_t q = p0;
    if (wide)
      for (; q + 2 <= p1 && (q + 2) * NR <= N; q += 2) {
        const float* next = pp + (q + 2 < p1 ? q + 2 : p0) * K * NR;
        panel<2, MR / 2>(xa, rows, pp + q * K * NR, K, yp + m0 * N + q * NR, N, next);
      }
    for (; q < p1; ++q) {  // one panel at a time: decode, and a wide span's odd or narrow last panel
      const float* next = pp + (q + 1 < p1 ? q + 1 : p0) * K * NR;
      const int64_t nc = std::min(NR, N - q * NR);
      float* out = yp + m0 * N + q * NR;
      int64_t ldo = N;
      if (nc < NR) {  // a last panel narrower than NR: its whole vectors into c, nc columns copied to y
        c.resize(rows * NR);
        out = c.data();
        ldo = NR;
      }
      if (wide) panel<1, MR / 2>(xa, rows, pp + q * K * NR, K, out, ldo, next);
      else panel<1, MR>(xa, rows, pp + q * K * NR, K, out, ldo, next);
      if (nc == NR) continue;
      for (int64_t m = 0; m < rows; ++m) std::copy_n(c.data() + m * NR, nc, yp + (m0 + m) * N + q * NR);
    }
  };
  if (M <= MB || nt == 1) {  // one row block (decode, a short prefill), or one thread
    const auto xa_t = at::empty({std::min(M, MB) * K}, x.options());  // uninitialised: no zero fill
    float* xa = xa_t.data_ptr<float>();
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
      const int64_t rows = std::min(MB, M - m0), tiles = (rows + mr - 1) / mr;
      if (rows * K < (1 << 16))  // a decode step's few rows: no parallel region for a copy of microseconds
        pack_rows(xp + m0 * ldx, ldx, rows, K, xa, 0, tiles, mr);
      else
        share(tiles, nt, 1, 1, [&](int64_t t0, int64_t t1) { pack_rows(xp + m0 * ldx, ldx, rows, K, xa, t0, t1, mr); });
      // guided spans: a thread the OS takes away leaves little to wait for
      share(P, nt, 1, 1, [&](int64_t p0, int64_t p1) {
        std::vector<float> c;
        block(m0, rows, xa, p0, p1, c);
      });
    }
  } else {  // row blocks (a prefill): one parallel region, x packed a block ahead into the other buffer
    const auto xa_t = at::empty({2 * MB * K}, x.options());
    float* xa[2] = {xa_t.data_ptr<float>(), xa_t.data_ptr<float>() + MB * K};
    const int64_t nb = (M + MB - 1) / MB;
#pragma omp parallel num_threads(nt)
    {
      const int64_t id = omp_get_thread_num(), T = omp_get_num_threads();
      auto pack = [&](int64_t b) {  // this thread's share of block b's row tiles
        const int64_t m0 = b * MB, rows = std::min(MB, M - m0), tiles = (rows + mr - 1) / mr;
        pack_rows(xp + m0 * ldx, ldx, rows, K, xa[b % 2], tiles * id / T, tiles * (id + 1) / T, mr);
      };
      std::vector<float> c;
      pack(0);
#pragma omp barrier
      for (int64_t b = 0; b < nb; ++b) {
        // an even split of the panels (each the same work): guided spans measured 2-6 % slower here
        block(b * MB, std::min(MB, M - b * MB), xa[b % 2], P * id / T, P * (id + 1) / T, c);
        if (b + 1 < nb) pack(b + 1);  // into the buffer no thread reads any more (block b - 1's)
#pragma omp barrier
      }
    }
  }
  if (bias.numel()) y.add_(bias);
  return y;
}

// out[i] = W[ids[i]] read from W's panels, exact copies (a tied embedding's lookup from the LM head's one
// copy). A panel row k holds a 4-byte unit per column: an fp32 value, or a bf16 pair; column j of panel p
// is W's row 32 p + j. Torch's two-index gather over the panels took 8 ms for a 2,048-token prefill.
void panel_rows(at::Tensor packed, at::Tensor ids, at::Tensor out) {
  PROFILE("inferlab::panel_rows");
  TORCH_CHECK(packed.is_contiguous() && packed.element_size() * (packed.dim() == 4 ? 2 : 1) == 4
              && packed.size(2) == NR && ids.scalar_type() == at::kLong && ids.is_contiguous()
              && out.is_contiguous() && out.scalar_type() == packed.scalar_type() && out.size(0) == ids.size(0),
              "panel_rows: (P, K, 32) fp32 or (P, K/2, 32, 2) bf16 panels, int64 ids, out (n, K) of their dtype");
  const int64_t P = packed.size(0), K = packed.size(1), n = ids.size(0);
  TORCH_CHECK(out.numel() == n * K * (packed.dim() == 4 ? 2 : 1), "panel_rows: out must be (n, K)");
  const auto* w = static_cast<const uint32_t*>(packed.data_ptr());
  auto* o = static_cast<uint32_t*>(out.data_ptr());
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(id[i] >= 0 && id[i] < P * NR, "panel_rows: id ", id[i], " out of range");
  at::parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint32_t* src = w + (id[i] / NR) * K * NR + id[i] % NR;
      for (int64_t k = 0; k < K; ++k) o[i * K + k] = src[k * NR];
    }
  });
}

}  // namespace inferlab

"""A C++ CPU GEMM for fp32 linear layers past a decode's few rows, on a packed copy of W.

At 64 decode rows (an offline batch) SmolLM2's step is ~75 % GEMM, and oneDNN's packed kernel there
reads W from memory and multiplies in turns: its time is about the arithmetic plus the read
(docs/perf/2026-12-03-gemm.md). This kernel keeps the next panel of W in flight while the current
one is multiplied, and needs no horizontal sums (the GEMV's dot products do: kernels/cpp_gemv.py).

Layout: W (N, K) is packed once into panels of NR = 32 output columns, k-major,

    packed[p, k, j] = W[p * NR + j, k]        (P, K, NR), zero past N

so one k step of a panel is two vector loads. The micro-kernel holds an MR x NR tile of y in 24
vector registers (MR = 12 rows of x, two 16-lane vectors of columns), and for each k broadcasts
x[m, k] into an FMA with the panel's two vectors: 24 FMAs per 14 loads, no shuffles. A panel is
taken 256 k at a time (32 KB, in L1) by every row group of x in turn, the first of them prefetching
the next slice; partial sums wait in y (a store and a load change no rounding). Threads grab spans
of panels from a shared counter (as the GEMV: a thread the OS took away does less).

Rounding: y[m, n] = fma(x[m, K-1], W[n, K-1], ... fma(x[m, 0], W[n, 0], 0)) in k order, then + bias:
one fixed sequence per output whatever M, the tile or the thread, so rows are batch-invariant.
Needs AVX-512 (`available()` is False elsewhere: PackedLinear keeps oneDNN).

    pack(W (N, K) fp32) -> (P, K, NR)
    gemm(x (M, K) fp32 rows, packed, N, bias (N,) or empty) -> y (M, N)
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from reference_engine.kernels import cpu_build

NR = 32  # output columns per panel: two AVX-512 vectors

SOURCE = cpu_build.HEADER + r"""
#include <atomic>

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

torch::Tensor gemm(torch::Tensor x, torch::Tensor packed, int64_t N, torch::Tensor bias) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.scalar_type() == at::kFloat, "gemm: x (M, K) float32 rows");
  TORCH_CHECK(packed.dim() == 3 && packed.is_contiguous() && packed.scalar_type() == at::kFloat &&
              packed.size(2) == NR && packed.size(1) == x.size(1) && packed.size(0) * NR >= N,
              "gemm: packed (P, K, 32) float32 from pack()");
  const int64_t M = x.size(0), K = x.size(1), ldx = x.stride(0), P = (N + NR - 1) / NR;
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* pp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), P));
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    const int64_t rows = std::min(MB, M - m0);
    std::atomic<int64_t> next{0};
    at::parallel_for(0, nt, 1, [&](int64_t, int64_t) {
      int64_t p0 = next.load(std::memory_order_relaxed);
      while (p0 < P) {
        const int64_t size = std::max<int64_t>(1, (P - p0) / (2 * nt));  // guided, as the GEMV
        if (!next.compare_exchange_weak(p0, p0 + size, std::memory_order_relaxed)) continue;
        for (int64_t q = p0; q < p0 + size; ++q) {
          const float* pf = pp + std::min(q + 1, p0 + size - 1) * K * NR;  // this span's next panel
          panel(xp + m0 * ldx, ldx, rows, pp + q * K * NR, K, yp + m0 * N + q * NR, N,
                std::min<int64_t>(NR, N - q * NR), pf);
        }
        p0 = next.load(std::memory_order_relaxed);
      }
    });
  }
  if (bias.numel()) y.add_(bias);
  return y;
}
#else
torch::Tensor gemm(torch::Tensor x, torch::Tensor packed, int64_t N, torch::Tensor bias) {
  TORCH_CHECK(false, "gemm: built without AVX-512");
}
#endif
"""


@functools.cache
def module():
    """The compiled extension (built once per process; the build itself is cached on disk)."""
    return cpu_build.load("inferlab_cpu_gemm", SOURCE, ["gemm"])


def pack(weight: torch.Tensor) -> torch.Tensor:
    """W (N, K) fp32 -> (P, K, NR) panels, k-major, zero past N: packed[p, k, j] = W[p * NR + j, k]."""
    n, k = weight.shape
    p = -(-n // NR)
    w = F.pad(weight.detach().float(), (0, 0, 0, p * NR - n))  # (P * NR, K)
    return w.view(p, NR, k).transpose(1, 2).contiguous()  # (P, K, NR)


def gemm(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x @ W.T (+ bias) for x (M, K) fp32 rows and `packed` = pack(W) of W (n, K)."""
    return module().gemm(x, packed, n, bias if bias is not None else x.new_empty(0))


@functools.cache
def available() -> bool:
    """Does the kernel build here and does this CPU have AVX-512 (its only code path)?"""
    return torch.backends.cpu.get_cpu_capability() == "AVX512" and cpu_build.builds(module)

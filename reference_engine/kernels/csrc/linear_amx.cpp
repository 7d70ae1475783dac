// y = x @ W.T (+ bias) for bf16 x on W's pair panels with AMX (Intel's tile unit, Xeon 4th generation
// "Sapphire Rapids" on): the same (P, K/2, NR, 2) panels as linear_bf16.cpp, no other copy.
//
// A pair panel is already AMX's B layout: one panel row is a k pair of 32 columns, (32, 2) bf16 = 128
// bytes, and a B tile is 16 such pairs of 16 columns, 64 bytes a row, so the panel's left and right
// halves are two B tiles loaded with a 128-byte stride. A tile is 16 rows of x, 32 bf16 each, read in
// place (row stride ldx). One tdpbf16ps multiplies 16 rows by 16 columns over 16 pairs.
//
// Sums: AMX's own. Each output is the chain over its K/32 tile steps, in k order, from zero, then + bias
// in fp32 and one rounding to bf16 (the same finish as linear_bf16.cpp). How the hardware adds the 32
// products inside one step is not the vdpbf16ps pair order (measured: it matches neither order), so the
// bits differ from the other bf16 paths; they are still one fixed sequence per output whatever M, the
// tile the row sits in or the thread, because rows never mix in a tile product: batch-invariant.
// Used where AMX runs (cpuid, and Linux's permission for the tile data) and K is a multiple of 32, for
// every row count: one bf16 path per weight. INFERLAB_AMX=0 turns it off (the pair order everywhere).
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "amx.h"
#include "kernels.h"

namespace inferlab {

#if defined(__AVX512F__)
static constexpr int64_t NR = 32;   // columns per panel (cpp_gemm.NR)
static constexpr int64_t RB = 32;   // rows per block: two A tiles
static constexpr int64_t GP = 8;   // panels per work item (prefill): read from L2 across its rows
static constexpr int64_t RI = 64;  // rows per work item
// Tiles (amx.h's configure): 0-3 the sums (rows 0-15 / 16-31 x columns 0-15 / 16-31 of the panel), 4 and 5
// the two A tiles, 6 and 7 the panel's halves; rows: of x and of the sums.

// One block's sums waiting to be finished (+ bias, rounded to bf16, written to y): done a few rows at a time
// from inside the next block's k loop, so the vector unit rounds while the tile unit multiplies. At the
// end of a block instead, the stores, the reads back and the rounding left the tile unit idle for a quarter
// of a K = 768 product (docs/perf/2026-12-05-bf16-prefill.md).
// With `up` (the SiLU-and-multiply epilogue): c holds a gate panel's sums and up the matching up panel's; a
// row's output is silu(g) * u with g and u first rounded to bf16, what the GEMM would have written and
// fused_ops.cpp's silu_mul read back, in its steps: the same bits, without the (M, 2I) round trip.
struct Pending {
  const float *c = nullptr, *up = nullptr;  // (rows, 32) sums
  int64_t rows = 0, done = 0, nc = 0, ldy = 0;
  at::BFloat16* y = nullptr;
  float bq[NR] = {};
  void finish(int64_t upto) {
    for (upto = std::min(upto, rows); done < upto; ++done) {
      if (!up) {
        finish_bf16(c + done * NR, bq, nc, y + done * ldy);
        continue;
      }
      const at::BFloat16* t = nullptr;  // picks rnd16's bf16 rounding
      for (int64_t j = 0; j < NR; j += 16) {
        const __m512 g = rnd16(_mm512_loadu_ps(c + done * NR + j), t), u = rnd16(_mm512_loadu_ps(up + done * NR + j), t);
        store16(y + done * ldy + j, _mm512_mul_ps(rnd16(_mm512_mul_ps(g, sigmoid16(g)), t), u));
      }
    }
  }
};

// RT x 16 rows of x (ldx elements apart) against one panel over K2 pairs -> c (RT x 16, 32) fp32, row
// stride 32; `prev`'s rows finished two per k step. RT = 1: a decode step's few rows, memory-bound, so it
// prefetches PF pairs ahead: this panel's, then the panel multiplied next (`next`: with the SiLU epilogue a
// gate panel is followed by its up panel, not by its neighbour).
template <int RT>
AMX_TARGET static void block(const at::BFloat16* x, int64_t ldx, const at::BFloat16* p, int64_t K2, float* c,
                             Pending& prev, const at::BFloat16* next) {
  constexpr int64_t PF = 64;  // pairs ahead: 8 KB of the panel in flight
  const int64_t sx = ldx * 2;  // bytes between x's rows
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (RT == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t k = 0; k < K2; k += 16) {  // (RT x 16 rows, 16 pairs) x (16 pairs, 32 columns)
    const at::BFloat16* w = p + k * NR * 2;
    if constexpr (RT == 1)
      for (int j = 0; j < 32; ++j) {  // pair a's two 64-byte lines (a prefetch never faults, past any end)
        const int64_t a = k + PF + j / 2;
        const at::BFloat16* src = a < K2 ? p + a * NR * 2 : next + (a - K2) * NR * 2;
        _mm_prefetch(reinterpret_cast<const char*>(src + (j % 2) * 32), _MM_HINT_T0);
      }
    _tile_loadd(4, x + 2 * k, sx);
    _tile_loadd(6, w, NR * 4);
    _tile_loadd(7, w + 32, NR * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (RT == 2) {
      _tile_loadd(5, x + 16 * ldx + 2 * k, sx);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    prev.finish(prev.done + 2);
  }
  prev.finish(prev.rows);
  _tile_stored(0, c, NR * 4);
  _tile_stored(1, c + 16, NR * 4);
  if constexpr (RT == 2) {
    _tile_stored(2, c + 16 * NR, NR * 4);
    _tile_stored(3, c + 16 * NR + 16, NR * 4);
  }
}

static bool can_run() {  // the CPU has AMX-TILE and AMX-BF16, and Linux lets this process use them
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return false;
  constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;  // Linux 5.16 on: ask once per process
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

bool amx_ready() {
  static const bool ready = [] {
    const char* off = std::getenv("INFERLAB_AMX");
    return !(off && std::strcmp(off, "0") == 0) && can_run();
  }();
  return ready;
}

// The rows of x in blocks of RB: whole blocks read in place, the last partial one from a zero-padded
// copy (a padded row only adds rows of sums that are dropped). Items: GP panels x RI rows, group-major.
// silu: W is gate and up stacked (N = 2 I, I a multiple of 32, no bias) and y (M, I) receives silu(gate) * up:
// logical panel q is gate panel q and up panel q + I / 32, multiplied one after the other.
void linear_amx(const at::BFloat16* xp, int64_t ldx, int64_t M, const at::BFloat16* pp, int64_t K2, int64_t N,
                const at::BFloat16* bias, at::BFloat16* yp, bool silu) {
  const int64_t Q = (N + NR - 1) / NR, P = silu ? Q / 2 : Q, ldy = silu ? N / 2 : N;
  const int64_t R = (M + RI - 1) / RI, threads = at::get_num_threads();
  // up to GP panels an item, as long as there are 8 items a thread (balance: a 128-token prompt's N = 576
  // is 18 panels x 2 row items; a decode step, one panel an item)
  const int64_t gp = std::clamp<int64_t>(P * R / (8 * threads), 1, GP), G = (P + gp - 1) / gp;
  const bool small = M <= 16;  // a decode step: one block, its tiles configured to M rows, x read in place
  const int64_t K = 2 * K2, whole = small ? M : M / RB * RB;
  std::unique_ptr<at::BFloat16[]> pad;
  if (whole < M) {
    pad.reset(new at::BFloat16[RB * K]());
    for (int64_t m = whole; m < M; ++m) std::memcpy(pad.get() + (m - whole) * K, xp + m * ldx, K * 2);
  }
  share(G * R, std::min<int64_t>(threads, G * R), 1, 1, [&](int64_t i0, int64_t i1) {
    configure(small ? M : 16);
    alignas(64) float c[2][2][RB * NR];  // this block's sums (and up's) and the previous block's, being finished
    Pending prev;
    int cur = 0;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t g = i / R, m1 = std::min(M, (i % R + 1) * RI);
      for (int64_t m0 = (i % R) * RI; m0 < m1; m0 += RB) {
        const bool full = small || m0 + RB <= whole;
        const at::BFloat16* x = full ? xp + m0 * ldx : pad.get();
        const int64_t rows = std::min(RB, M - m0);
        for (int64_t q = g * gp; q < std::min(P, (g + 1) * gp); ++q) {
          for (int64_t half = 0; half < (silu ? 2 : 1); ++half) {  // the panel; with silu, gate then up
            const at::BFloat16* w = pp + (q + half * P) * K2 * NR * 2;
            // the panel after: silu's up panel after its gate, else this thread's most likely next (q + 1)
            const at::BFloat16* next = pp + (silu && half == 0 ? q + P : q + 1) * K2 * NR * 2;
            if (rows <= 16) block<1>(x, full ? ldx : K, w, K2, c[cur][half], prev, next);
            else block<2>(x, full ? ldx : K, w, K2, c[cur][half], prev, next);
          }
          const int64_t n0 = q * NR, nc = std::min(NR, ldy - n0);
          prev.c = c[cur][0], prev.up = silu ? c[cur][1] : nullptr, prev.rows = rows, prev.done = 0, prev.nc = nc;
          prev.ldy = ldy, prev.y = yp + m0 * ldy + n0;
          for (int64_t j = 0; j < NR; ++j) prev.bq[j] = bias && j < nc ? static_cast<float>(bias[n0 + j]) : 0.f;
          cur ^= 1;
        }
      }
    }
    prev.finish(prev.rows);
  });
}

#else
bool amx_ready() { return false; }
void linear_amx(const at::BFloat16*, int64_t, int64_t, const at::BFloat16*, int64_t, int64_t, const at::BFloat16*,
                at::BFloat16*, bool) {
  TORCH_CHECK(false, "linear_amx: not in this build");
}
#endif

}  // namespace inferlab

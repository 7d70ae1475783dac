// What the AMX kernels (linear_amx.cpp, attention_amx.cpp) share: the tile configuration, defined once, and
// the AMX GEMM's entry for linear_bf16.cpp. AMX is Intel's tile unit (Xeon 4th generation on); its code is
// in the AVX-512 build only.
#pragma once

#include <cstring>

#include "common.h"

namespace inferlab {

// linear_amx.cpp: y = x @ W.T (+ bias) on the pair panels with AMX's own sums (batch-invariant); with `silu`,
// silu(gate) * up of the stacked gate_up panels. Where amx_ready() and K % 32 == 0.
void linear_amx(const at::BFloat16* x, int64_t ldx, int64_t M, const at::BFloat16* packed, int64_t K2, int64_t N,
                const at::BFloat16* bias, at::BFloat16* y, bool silu);

#if defined(__AVX512F__)
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))

struct alignas(64) TileConfig {  // ldtilecfg's 64-byte operand, palette 1
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-7, 64 bytes a row: 0-5 of `rows` rows, 6 and 7 (B tiles: always 16 pairs) of 16. Tile state is
// per thread and stays configured after a call (no tilerelease: loading a configuration costs as much as a
// decode step's small product); what another kernel or library left there is read back and replaced only
// where it differs.
AMX_TARGET static inline void configure(int rows) {
  TileConfig c, now;
  for (int t = 0; t < 8; ++t) c.rows[t] = t < 6 ? rows : 16, c.colsb[t] = 64;
  _tile_storeconfig(&now);
  asm volatile("" : : "r"(&c), "r"(&now) : "memory");  // GCC 12 drops stores a tile op reads: keep them
  if (std::memcmp(&c, &now, sizeof c) != 0) _tile_loadconfig(&c);
}
#endif

}  // namespace inferlab

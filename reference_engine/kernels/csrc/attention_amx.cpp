// Paged causal prefill attention for bf16 on AMX (the tile unit of Xeon 4th generation on): the contract of
// attention_prefill.cpp's `prefill`, with both products on tiles (layout: reference_engine/kernels/ops.py's prefill_amx).
//
// A task is (sequence, kv head, QC query tokens); its R = tokens x G query rows (G query heads share the kv
// head) go in tiles of 16 rows. The task first lays out, once, every key its last row sees:
//   kt[pp][key] = the pair (K[key][2 pp], K[key][2 pp + 1])        (D/2, L32) 32-bit units: K^T, AMX's B layout
//   vp[kk][d]   = the pair (V[2 kk][d], V[2 kk + 1][d])            (L32/2, D): V over key pairs, B layout too
// (zero past the last key, so a masked key multiplies zeros, never stale cache). Then per 16-row tile and
// chunk of KC keys: S = Q K^T (16 x KC fp32, two 16-key tiles per 32-key step), an online softmax per row
// (fp32, scale applied here), P rounded to bf16, and O = P V in four 16-column tiles per 64 of D.
//
// Sums: AMX's own inside a tile step (as linear_amx.cpp), P in bf16 (as FlashAttention); everything else in
// fp32. A row's bits depend only on its query, the keys it sees and the chunk boundaries, which sit at fixed
// key positions (0, KC, 2 KC, ...): not on the tile, the task or the thread. Steps past a row's last key add
// exact zeros. So prompts give the same bits alone, batched, chunked or after a cached prefix.
#include <cstring>
#include <vector>

#include "amx.h"
#include "attention.h"
#include "kernels.h"

namespace inferlab {

#if defined(__AVX512F__)
static constexpr int64_t QC = 32;   // query tokens per task
static constexpr int64_t KC = 256;  // keys per softmax chunk: S and P of a 16-row tile stay in L1

// kt, vp (above) for keys [0, len) of kv head h through the block table; L32 = len rounded up to 32. K^T
// 16 keys at a time, one gather per pair column (32-bit offsets: a layer's cache under 8 GB, checked below); V two keys at a time, their rows interleaved by one permute per 32 columns.
static void lay_out(const at::BFloat16* kc, const at::BFloat16* vc, const int64_t* table, int64_t len, int64_t L32,
                    int64_t h, int64_t Hkv, int64_t D, int64_t bs, uint32_t* kt, uint32_t* vp) {
  const int64_t stride = Hkv * D, block = bs * stride, D2 = D / 2;
  auto row = [&](int64_t t) { return table[t / bs] * block + (t % bs) * stride + h * D; };  // key t's offset
  const auto* k32 = reinterpret_cast<const int*>(kc);
  int64_t t = 0;
  for (; t + 16 <= len; t += 16) {
    alignas(64) int32_t at[16];
    for (int j = 0; j < 16; ++j) at[j] = static_cast<int32_t>(row(t + j) / 2);
    const __m512i idx = _mm512_load_si512(at);
    for (int64_t p = 0; p < D2; ++p)
      _mm512_storeu_si512(kt + p * L32 + t, _mm512_i32gather_epi32(idx, k32 + p, 4));
  }
  for (; t < L32; ++t)  // the last keys, and zeros up to L32
    for (int64_t p = 0; p < D2; ++p) kt[p * L32 + t] = t < len ? reinterpret_cast<const uint32_t*>(kc + row(t))[p] : 0;
  alignas(64) int16_t lo[32], hi[32];  // word i of the pair (a, b): a's column i / 2 or b's
  for (int i = 0; i < 32; ++i) lo[i] = static_cast<int16_t>(i / 2 + (i % 2) * 32), hi[i] = lo[i] + 16;
  const __m512i ilo = _mm512_load_si512(lo), ihi = _mm512_load_si512(hi), zero = _mm512_setzero_si512();
  for (int64_t u = 0; u < L32; u += 2) {
    const at::BFloat16* a = u < len ? vc + row(u) : nullptr;
    const at::BFloat16* b = u + 1 < len ? vc + row(u + 1) : nullptr;
    for (int64_t d = 0; d < D; d += 32) {
      const __m512i va = a ? _mm512_loadu_si512(a + d) : zero, vb = b ? _mm512_loadu_si512(b + d) : zero;
      _mm512_storeu_si512(vp + (u / 2) * D + d, _mm512_permutex2var_epi16(va, ilo, vb));
      _mm512_storeu_si512(vp + (u / 2) * D + d + 16, _mm512_permutex2var_epi16(va, ihi, vb));
    }
  }
}

// One chunk's online softmax for 16 rows: s (16, KC) scores of keys [t0, t0 + n); row r sees up to key
// last[r] (absolute). p = e^(scale s - m_new) in bf16 into pb (16, KC) (0 where not seen, and past n up to
// the 32-key step); l = l c + sum p; c = e^(m - m_new), the rescale of the row's running output.
static void softmax_rows(const float* s, int64_t t0, int64_t n, int64_t n32, const int64_t* last, float scale,
                         float* m, float* l, float* c, at::BFloat16* pb) {
  const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
  for (int r = 0; r < 16; ++r) {
    const float* sr = s + r * KC;
    at::BFloat16* pr = pb + r * KC;
    const int64_t seen = std::clamp<int64_t>(last[r] + 1 - t0, 0, n);
    __m512 mx = _mm512_set1_ps(m[r]);
    for (int64_t j = 0; j < seen; j += 16) {
      const __mmask16 in = seen - j >= 16 ? 0xffff : static_cast<__mmask16>((1u << (seen - j)) - 1);
      mx = _mm512_max_ps(mx, _mm512_mask_blend_ps(in, ninf, _mm512_mul_ps(_mm512_loadu_ps(sr + j), sc)));
    }
    const float mn = _mm512_reduce_max_ps(mx);
    const __m512 mv = _mm512_set1_ps(mn);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n32; j += 16) {
      const int64_t left = seen - j;
      const __mmask16 in = left >= 16 ? 0xffff : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
      const __m512 p = _mm512_maskz_mov_ps(in, exp16(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(sr + j), sc), mv)));
      sum = _mm512_add_ps(sum, p);
      store16(pr + j, p);
    }
    c[r] = seen ? (m[r] == -INFINITY ? 0.f : std::exp(m[r] - mn)) : 1.f;  // a row seeing nothing keeps its state
    if (seen) m[r] = mn;
    l[r] = l[r] * c[r] + _mm512_reduce_add_ps(sum);
  }
}

// The rows [i0, i0 + 16) of a task (row i: query token i / G of the task, head g = i % G): qp (16, D) bf16,
// last[r] the last key row r sees; o (16, D) fp32 receives the normalised output.
AMX_TARGET static void tile_rows(const at::BFloat16* qp, const int64_t* last, const uint32_t* kt,
                                 const uint32_t* vp, int64_t L32, int64_t D, float scale, float* s, at::BFloat16* pb,
                                 float* part, float* o) {
  float m[16], l[16], c[16];
  std::fill(m, m + 16, -INFINITY);
  std::fill(l, l + 16, 0.f);
  std::fill(o, o + 16 * D, 0.f);
  const int64_t keys = *std::max_element(last, last + 16) + 1;
  for (int64_t t0 = 0; t0 < keys; t0 += KC) {
    const int64_t n = std::min(KC, keys - t0), n32 = (n + 31) / 32 * 32;
    int64_t j = 0;
    for (; j + 64 <= n32; j += 64) {  // S = Q K^T: 16 rows x 64 keys a step, four chains in flight
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t dc = 0; dc < D; dc += 32) {
        const uint32_t* kp = kt + (dc / 2) * L32 + t0 + j;
        _tile_loadd(4, qp + dc, D * 2);
        _tile_loadd(6, kp, L32 * 4);
        _tile_loadd(7, kp + 16, L32 * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(6, kp + 32, L32 * 4);
        _tile_loadd(7, kp + 48, L32 * 4);
        _tile_dpbf16ps(2, 4, 6);
        _tile_dpbf16ps(3, 4, 7);
      }
      _tile_stored(0, s + j, KC * 4);
      _tile_stored(1, s + j + 16, KC * 4);
      _tile_stored(2, s + j + 32, KC * 4);
      _tile_stored(3, s + j + 48, KC * 4);
    }
    for (; j < n32; j += 32) {  // the last 32
      _tile_zero(0);
      _tile_zero(1);
      for (int64_t dc = 0; dc < D; dc += 32) {
        _tile_loadd(4, qp + dc, D * 2);
        _tile_loadd(6, kt + (dc / 2) * L32 + t0 + j, L32 * 4);
        _tile_loadd(7, kt + (dc / 2) * L32 + t0 + j + 16, L32 * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
      }
      _tile_stored(0, s + j, KC * 4);
      _tile_stored(1, s + j + 16, KC * 4);
    }
    softmax_rows(s, t0, n, n32, last, scale, m, l, c, pb);
    for (int64_t d0 = 0; d0 < D; d0 += 64) {  // O += P V: four 16-column tiles a pass
      const int64_t nd = std::min<int64_t>(4, (D - d0) / 16);
      _tile_zero(0);  // tile numbers are immediates: the four written out
      if (nd > 1) _tile_zero(1);
      if (nd > 2) _tile_zero(2);
      if (nd > 3) _tile_zero(3);
      for (int64_t j = 0; j < n32; j += 32) {
        _tile_loadd(4, pb + j, KC * 2);
        const uint32_t* v = vp + ((t0 + j) / 2) * D + d0;
        _tile_loadd(6, v, D * 4);
        _tile_dpbf16ps(0, 4, 6);
        if (nd > 1) { _tile_loadd(7, v + 16, D * 4); _tile_dpbf16ps(1, 4, 7); }
        if (nd > 2) { _tile_loadd(6, v + 32, D * 4); _tile_dpbf16ps(2, 4, 6); }
        if (nd > 3) { _tile_loadd(7, v + 48, D * 4); _tile_dpbf16ps(3, 4, 7); }
      }
      _tile_stored(0, part, 64 * 4);
      if (nd > 1) _tile_stored(1, part + 16, 64 * 4);
      if (nd > 2) _tile_stored(2, part + 32, 64 * 4);
      if (nd > 3) _tile_stored(3, part + 48, 64 * 4);
      for (int r = 0; r < 16; ++r)  // o = o c + this chunk's part
        for (int64_t d = 0; d < nd * 16; d += 16) {
          float* od = o + r * D + d0 + d;
          _mm512_storeu_ps(od, _mm512_fmadd_ps(_mm512_loadu_ps(od), _mm512_set1_ps(c[r]),
                                               _mm512_loadu_ps(part + r * 64 + d)));
        }
    }
  }
  for (int r = 0; r < 16; ++r) {
    const __m512 inv = _mm512_set1_ps(l[r] > 0.f ? 1.f / l[r] : 0.f);
    for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(o + r * D + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * D + d), inv));
  }
}

void prefill_amx(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor block_tables,
                 at::Tensor seq_lens, at::Tensor query_start, double scale, at::Tensor out) {
  PROFILE("inferlab::attention_prefill_amx");
  TORCH_CHECK(amx_ready(), "prefill_amx: no AMX here (or INFERLAB_AMX=0)");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16 &&
              v_cache.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16,
              "prefill_amx: bf16 q, caches and out");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2) && out.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
              block_tables.scalar_type() == at::kLong && block_tables.stride(1) == 1 &&
              seq_lens.scalar_type() == at::kLong && seq_lens.is_contiguous() &&
              query_start.scalar_type() == at::kLong && query_start.is_contiguous(),
              "prefill_amx: q (N, H, D) with dense heads (any token stride), contiguous caches and out, int64 tables, lengths, starts");
  const int64_t B = seq_lens.size(0), H = q.size(1), D = q.size(2), bs = k_cache.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && H % Hkv == 0 && D % 32 == 0 && block_tables.size(0) >= B &&
              query_start.size(0) == B + 1, "prefill_amx: shape mismatch (head size a multiple of 32)");
  TORCH_CHECK(k_cache.numel() / 2 < INT32_MAX, "prefill_amx: a layer's cache of 8 GB or more (use prefill)");
  const int64_t G = H / Hkv, width = block_tables.stride(0), qs = q.stride(0);
  const auto* qp = q.data_ptr<at::BFloat16>();
  auto* op = out.data_ptr<at::BFloat16>();
  const auto *kc = k_cache.data_ptr<at::BFloat16>(), *vc = v_cache.data_ptr<at::BFloat16>();
  const int64_t *tables = block_tables.data_ptr<int64_t>(), *lens = seq_lens.data_ptr<int64_t>(),
                *starts = query_start.data_ptr<int64_t>();
  // tasks (sequence, first token, kv head), each thread a contiguous run of equal work (attention.h)
  split_prefill(lens, starts, B, Hkv, QC, [&](const std::vector<PrefillTask>& tasks, int64_t w0, int64_t w1) {
    configure(16);
    std::vector<uint32_t> kt, vp;
    std::vector<at::BFloat16> qt(16 * D), pb(16 * KC);
    std::vector<float> s(16 * KC), part(16 * 64), o(16 * D);
    for (int64_t w = w0; w < w1; ++w) {
      const PrefillTask& k = tasks[w];
      const int64_t qlen = starts[k.b + 1] - starts[k.b], pos0 = lens[k.b] - qlen, r1 = std::min(qlen, k.r0 + QC);
      const int64_t len = pos0 + r1, L32 = (len + 31) / 32 * 32, R = (r1 - k.r0) * G;
      kt.resize(D / 2 * L32);  // no zero fill: lay_out writes every element
      vp.resize(L32 / 2 * D);
      lay_out(kc, vc, tables + k.b * width, len, L32, k.h, Hkv, D, bs, kt.data(), vp.data());
      const at::BFloat16* qb = qp + starts[k.b] * qs;
      at::BFloat16* ob = op + starts[k.b] * H * D;
      for (int64_t i0 = 0; i0 < R; i0 += 16) {
        int64_t last[16];
        for (int64_t r = 0; r < 16; ++r) {  // rows past R: a copy of row 0's query, dropped at the end
          const int64_t i = i0 + r < R ? i0 + r : 0, tok = k.r0 + i / G;
          std::memcpy(qt.data() + r * D, qb + tok * qs + (k.h * G + i % G) * D, D * 2);
          last[r] = pos0 + tok;
        }
        tile_rows(qt.data(), last, kt.data(), vp.data(), L32, D, static_cast<float>(scale), s.data(), pb.data(),
                  part.data(), o.data());
        for (int64_t r = 0; r < std::min<int64_t>(16, R - i0); ++r) {
          const int64_t i = i0 + r, tok = k.r0 + i / G;
          at::BFloat16* dst = ob + (tok * H + k.h * G + i % G) * D;
          for (int64_t d = 0; d < D; d += 16) store16(dst + d, _mm512_loadu_ps(o.data() + r * D + d));
        }
      }
    }
  });
}

#else
void prefill_amx(at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, double, at::Tensor) {
  TORCH_CHECK(false, "prefill_amx: not in this build (AVX-512 only)");
}
#endif

}  // namespace inferlab

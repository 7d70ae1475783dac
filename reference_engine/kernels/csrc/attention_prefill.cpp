// Paged causal attention for chunks of query tokens (layout and tiling: reference_engine/kernels/ops.py's prefill).
#include "attention.h"
#include "kernels.h"

#include <algorithm>

namespace inferlab {

#ifdef VEC8  // the scores on 8 lanes (AVX2) and, in the AVX-512 build, 16 (simd.h's Vec): the same per lane
// s[t * R8 + i] = q_i . k_t for IV vectors of V's lanes of query rows from qt and RK keys from k (summed
// over d in order)
template <class V, int IV, int RK, typename T>
static inline void scores_tile(const float* qt, int64_t R8, const T* k, int64_t stride, float* s, int64_t D) {
  constexpr int L = V::W;
  typename V::T a[RK][IV];
  for (int t = 0; t < RK; ++t)
    for (int v = 0; v < IV; ++v) a[t][v] = V::zero();
  for (int64_t d = 0; d < D; ++d) {
    typename V::T qv[IV];
    for (int v = 0; v < IV; ++v) qv[v] = V::load(qt + d * R8 + L * v);
    for (int t = 0; t < RK; ++t) {
      const typename V::T kb = V::set1(static_cast<float>(k[t * stride + d]));
      for (int v = 0; v < IV; ++v) a[t][v] = V::fma(kb, qv[v], a[t][v]);
    }
  }
  for (int t = 0; t < RK; ++t)
    for (int v = 0; v < IV; ++v) V::store(s + t * R8 + L * v, a[t][v]);
}

template <class V, int IV, int RK, typename T>  // the last r < 6 keys: the tile picked at run time
static inline void scores_tail(int64_t r, const float* qt, int64_t R8, const T* k, int64_t stride, float* s,
                               int64_t D) {
  if constexpr (RK > 0) {
    if (r != RK) return scores_tail<V, IV, RK - 1>(r, qt, R8, k, stride, s, D);
    scores_tile<V, IV, RK>(qt, R8, k, stride, s, D);
  }
}

template <class V, int IV, typename T>
static inline void scores_keys(const float* qt, int64_t R8, const T* k, int64_t stride, int64_t n, float* s,
                               int64_t D) {
  int64_t t = 0;
  for (; t + 6 <= n; t += 6) scores_tile<V, IV, 6>(qt, R8, k + t * stride, stride, s + t * R8, D);
  if (t < n) scores_tail<V, IV, 5>(n - t, qt, R8, k + t * stride, stride, s + t * R8, D);
}
#endif

// s[t * R8 + i] = q_i . k_t for the R8 rows of qt (D, R8) and n key rows k_t = k + t * stride
template <typename T>
static void scores_t(const float* qt, int64_t R8, const T* k, int64_t stride, int64_t n, float* s, int64_t D) {
#ifdef VEC8
  int64_t i = 0;
#ifdef VEC16
  for (; i + 48 <= R8; i += 48) scores_keys<Vec<16>, 3>(qt + i, R8, k, stride, n, s + i, D);
  for (; i + 16 <= R8; i += 16) scores_keys<Vec<16>, 1>(qt + i, R8, k, stride, n, s + i, D);
#endif
  for (; i + 16 <= R8; i += 16) scores_keys<Vec<8>, 2>(qt + i, R8, k, stride, n, s + i, D);
  if (i < R8) scores_keys<Vec<8>, 1>(qt + i, R8, k, stride, n, s + i, D);
#else
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < R8; ++i) {
      float x = 0.f;
      for (int64_t d = 0; d < D; ++d) x = std::fma(qt[d * R8 + i], static_cast<float>(k[t * stride + d]), x);
      s[t * R8 + i] = x;
    }
#endif
}

// Online softmax over one block's n key-major scores: row i sees the block's first min(n, first + i / G)
// keys. s becomes p = e^(s - m_new) (0 where not seen); l = l * c + sum p, acc rows *= c, c = e^(m - m_new).
// Every row sees key 0 in the first block, so m is finite from then on.
#ifdef VEC16
// softmax_t's 8-row step below for rows i0 .. i0 + 15 on 16 lanes: the same operations per row; c: the rescales
static void softmax16(float* s, int64_t R8, int64_t n, int64_t first, int64_t G, float* m, float* l, int64_t i0,
                      float* c) {
  int32_t seen[16];
  for (int j = 0; j < 16; ++j) seen[j] = static_cast<int32_t>(std::min(n, first + (i0 + j) / G));
  const __m512i vis = _mm512_loadu_si512(seen);
  const __m512 ninf = _mm512_set1_ps(-INFINITY), m0 = _mm512_loadu_ps(m + i0);
  __m512 mx = m0;
  for (int64_t t = 0; t < n; ++t) {
    const __mmask16 in = _mm512_cmpgt_epi32_mask(vis, _mm512_set1_epi32(static_cast<int32_t>(t)));
    mx = _mm512_max_ps(mx, _mm512_mask_blend_ps(in, ninf, _mm512_loadu_ps(s + t * R8 + i0)));
  }
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const __mmask16 in = _mm512_cmpgt_epi32_mask(vis, _mm512_set1_epi32(static_cast<int32_t>(t)));
    const __m512 x = _mm512_mask_blend_ps(in, ninf, _mm512_sub_ps(_mm512_loadu_ps(s + t * R8 + i0), mx));
    const __m512 p = _mm512_maskz_mov_ps(in, exp16(x));
    _mm512_storeu_ps(s + t * R8 + i0, p);
    sum = _mm512_add_ps(sum, p);
  }
  const __m512 cv = exp16(_mm512_sub_ps(m0, mx));
  _mm512_storeu_ps(c, cv);
  _mm512_storeu_ps(l + i0, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(l + i0), cv), sum));
  _mm512_storeu_ps(m + i0, mx);
}
#endif

static void softmax_t(float* s, int64_t R8, int64_t n, int64_t first, int64_t G, float* m, float* l, float* acc,
                      int64_t D) {
  for (int64_t i0 = 0; i0 < R8;) {
    float c[16];
    int64_t w = 8;  // rows this step
#ifdef VEC16
    if (i0 + 16 <= R8) {
      softmax16(s, R8, n, first, G, m, l, i0, c);
      w = 16;
    } else
#endif
    {
#ifdef VEC8
      int32_t seen[8];
      for (int j = 0; j < 8; ++j) seen[j] = static_cast<int32_t>(std::min(n, first + (i0 + j) / G));
      const __m256i vis = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(seen));
      const __m256 ninf = _mm256_set1_ps(-INFINITY);
      const __m256 m0 = _mm256_loadu_ps(m + i0);
      __m256 mx = m0;
      for (int64_t t = 0; t < n; ++t) {
        const __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(vis, _mm256_set1_epi32(static_cast<int32_t>(t))));
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + t * R8 + i0), in));
      }
      __m256 sum = _mm256_setzero_ps();
      for (int64_t t = 0; t < n; ++t) {
        const __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(vis, _mm256_set1_epi32(static_cast<int32_t>(t))));
        const __m256 x = _mm256_blendv_ps(ninf, _mm256_sub_ps(_mm256_loadu_ps(s + t * R8 + i0), mx), in);
        const __m256 p = _mm256_and_ps(exp8(x), in);
        _mm256_storeu_ps(s + t * R8 + i0, p);
        sum = _mm256_add_ps(sum, p);
      }
      const __m256 cv = exp8(_mm256_sub_ps(m0, mx));
      _mm256_storeu_ps(c, cv);
      _mm256_storeu_ps(l + i0, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(l + i0), cv), sum));
      _mm256_storeu_ps(m + i0, mx);
#else
      for (int64_t j = 0; j < 8; ++j) {
        const int64_t i = i0 + j, nn = std::min(n, first + i / G);
        float mx = m[i], sum = 0.f;
        for (int64_t t = 0; t < nn; ++t) mx = std::max(mx, s[t * R8 + i]);
        for (int64_t t = 0; t < n; ++t) {
          const float p = t < nn ? std::exp(s[t * R8 + i] - mx) : 0.f;
          s[t * R8 + i] = p;
          sum += p;
        }
        c[j] = std::exp(m[i] - mx);
        l[i] = l[i] * c[j] + sum;
        m[i] = mx;
      }
#endif
    }
    for (int j = 0; j < w; ++j)
      if (c[j] != 1.f)
        for (int64_t d = 0; d < D; ++d) acc[(i0 + j) * D + d] *= c[j];
    i0 += w;
  }
}

// Rows [r0, r1) of one sequence's query chunk (row r at absolute position pos0 + r), kv head h. Row r
// attends keys 0 .. pos0 + r of its sequence, all in the cache (the step's own keys were written
// first). Buffers (floats): qt, acc (R8 * D); s (bs * R8); m, l (R8).
template <typename T>
static void prefill_task(const T* q, const T* kc, const T* vc, const int64_t* table, int64_t pos0, int64_t r0,
                         int64_t r1, int64_t h, T* out, int64_t H, int64_t Hkv, int64_t D, int64_t bs, float scale,
                         float* qt, float* acc, float* s, float* m, float* l) {
  const int64_t G = H / Hkv, R = (r1 - r0) * G, R8 = (R + 7) / 8 * 8, stride = Hkv * D, block = bs * stride;
  std::fill(qt, qt + D * R8, 0.f);
  for (int64_t i = 0; i < R; ++i) {  // (R, D) -> (D, R8), scaled
    const T* src = q + ((r0 + i / G) * H + h * G + i % G) * D;
    for (int64_t d = 0; d < D; ++d) qt[d * R8 + i] = static_cast<float>(src[d]) * scale;
  }
  std::fill(acc, acc + R8 * D, 0.f);
  std::fill(m, m + R8, -INFINITY);
  std::fill(l, l + R8, 0.f);
  const int64_t len = pos0 + r1;  // keys the last row sees
  for (int64_t t0 = 0; t0 < len; t0 += bs) {
    const int64_t n = std::min(bs, len - t0), blk = table[t0 / bs];
    scores_t(qt, R8, kc + blk * block + h * D, stride, n, s, D);
    softmax_t(s, R8, n, pos0 + r0 + 1 - t0, G, m, l, acc, D);
    accumulate(s, 1, R8, vc + blk * block + h * D, stride, n, acc, R, D);
  }
  for (int64_t i = 0; i < R; ++i) {
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    T* o = out + ((r0 + i / G) * H + h * G + i % G) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(acc[i * D + d] * inv);
  }
}

static constexpr int64_t TILE = 16;  // query rows per prefill task: their G heads share every key row read

template <typename T>
static void prefill_impl(const T* q, const T* kc, const T* vc, const int64_t* tables, const int64_t* lens,
                         const int64_t* starts, T* out, int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t bs,
                         int64_t width, float scale) {
  const int64_t G = H / Hkv, R8 = (TILE * G + 7) / 8 * 8;
  split_prefill(lens, starts, B, Hkv, TILE, [&](const std::vector<PrefillTask>& tasks, int64_t w0, int64_t w1) {
    std::vector<float> qt(R8 * D), acc(R8 * D), s(bs * R8), m(R8), l(R8);
    for (int64_t w = w0; w < w1; ++w) {
      const PrefillTask& k = tasks[w];
      const int64_t qlen = starts[k.b + 1] - starts[k.b], r1 = std::min(qlen, k.r0 + TILE);
      prefill_task(q + starts[k.b] * H * D, kc, vc, tables + k.b * width, lens[k.b] - qlen, k.r0, r1, k.h,
                   out + starts[k.b] * H * D, H, Hkv, D, bs, scale, qt.data(), acc.data(), s.data(), m.data(),
                   l.data());
    }
  });
}

void prefill(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor block_tables,
             at::Tensor seq_lens, at::Tensor query_start, double scale, at::Tensor out) {
  PROFILE("inferlab::attention_prefill");
  TORCH_CHECK(q.is_contiguous() && out.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "prefill: contiguous tensors expected");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong
              && query_start.scalar_type() == at::kLong && block_tables.stride(1) == 1 && seq_lens.is_contiguous()
              && query_start.is_contiguous(), "prefill: int64 row-major tables, lengths and starts expected");
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type()
              && out.scalar_type() == q.scalar_type(), "prefill: q, caches and out must share a dtype");
  const int64_t B = seq_lens.size(0), H = q.size(1), D = q.size(2), bs = k_cache.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && H % Hkv == 0 && block_tables.size(0) >= B && query_start.size(0) == B + 1,
              "prefill: shape mismatch");
  if (q.scalar_type() == at::kFloat) {
    prefill_impl<float>(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                        block_tables.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(),
                        query_start.data_ptr<int64_t>(), out.data_ptr<float>(), B, H, Hkv, D, bs,
                        block_tables.stride(0), (float)scale);
  } else if (q.scalar_type() == at::kBFloat16) {
    using bf = at::BFloat16;
    prefill_impl<bf>(q.data_ptr<bf>(), k_cache.data_ptr<bf>(), v_cache.data_ptr<bf>(),
                     block_tables.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(),
                     query_start.data_ptr<int64_t>(), out.data_ptr<bf>(), B, H, Hkv, D, bs,
                     block_tables.stride(0), (float)scale);
  } else {
    TORCH_CHECK(false, "prefill: float32 or bfloat16 expected, got ", q.scalar_type());
  }
}

}  // namespace inferlab

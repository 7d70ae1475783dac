// Paged attention for one query token per sequence (layout and blocking: reference_engine/kernels/ops.py's decode).
#include "attention.h"
#include "kernels.h"

namespace inferlab {

// x[r] = e^(x[r] - mx) for r < n; returns their sum.
static inline float exp_shifted(float* x, int64_t n, float mx) {
  float sum = 0.f;
  int64_t r = 0;
#ifdef VEC8
  __m256 acc = _mm256_setzero_ps();
  for (; r + 8 <= n; r += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + r), _mm256_set1_ps(mx)));
    _mm256_storeu_ps(x + r, e);
    acc = _mm256_add_ps(acc, e);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  for (int i = 0; i < 8; ++i) sum += lanes[i];
#endif
  for (; r < n; ++r) { x[r] = std::exp(x[r] - mx); sum += x[r]; }
  return sum;
}

// s[g * ld + r] = q_g . k_r for the G query rows q (G, D) and key rows k_r = k + r * stride, r < n.
#ifdef VEC8
// GN query rows against key rows r0 .. r0 + 7, four at a time: each key chunk is loaded once for the
// GN rows (GN x 4 accumulators). Every sum adds the same terms in the same order as one row at a time.
template <int GN, typename T>
static inline void scores8(const float* q, const T* k, int64_t stride, int64_t r0, float* s, int64_t ld,
                           int64_t D) {
  __m256 a[GN][8];
  for (int half = 0; half < 8; half += 4) {
    for (int g = 0; g < GN; ++g)
      for (int r = 0; r < 4; ++r) a[g][half + r] = _mm256_setzero_ps();
    for (int64_t c = 0; c < D; c += 8) {
      __m256 kv[4];
      for (int r = 0; r < 4; ++r) kv[r] = load8(k + (r0 + half + r) * stride + c);
      for (int g = 0; g < GN; ++g) {
        const __m256 qv = _mm256_loadu_ps(q + g * D + c);
        for (int r = 0; r < 4; ++r) a[g][half + r] = _mm256_fmadd_ps(qv, kv[r], a[g][half + r]);
      }
    }
  }
  for (int g = 0; g < GN; ++g) _mm256_storeu_ps(s + g * ld + r0, reduce8(a[g]));
}

#endif

#ifdef VEC16
// scores8 with two key rows in each 512-bit vector (row 2j in the low 8 lanes, 2j + 1 in the high), all 8
// rows at once: every lane adds the same terms in the same order as scores8's, and the halves are reduced
// as there, so the same bits as the AVX2 build, in half the FMAs.
template <int GN, typename T>
static inline void scores16(const float* q, const T* k, int64_t stride, int64_t r0, float* s, int64_t ld,
                            int64_t D) {
  __m512 a[GN][4];
  for (int g = 0; g < GN; ++g)
    for (int j = 0; j < 4; ++j) a[g][j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < D; c += 8) {
    __m512 kv[4];
    for (int j = 0; j < 4; ++j)
      kv[j] = _mm512_insertf32x8(_mm512_castps256_ps512(load8(k + (r0 + 2 * j) * stride + c)),
                                 load8(k + (r0 + 2 * j + 1) * stride + c), 1);
    for (int g = 0; g < GN; ++g) {
      const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + g * D + c));
      for (int j = 0; j < 4; ++j) a[g][j] = _mm512_fmadd_ps(qv, kv[j], a[g][j]);
    }
  }
  for (int g = 0; g < GN; ++g) {
    __m256 rows[8];
    for (int j = 0; j < 4; ++j) {
      rows[2 * j] = _mm512_castps512_ps256(a[g][j]);
      rows[2 * j + 1] = _mm512_extractf32x8_ps(a[g][j], 1);
    }
    _mm256_storeu_ps(s + g * ld + r0, reduce8(rows));
  }
}
#endif

template <typename T>
static inline void scores(const float* q, const T* k, int64_t stride, int64_t n, float* s, int64_t ld,
                          int64_t G, int64_t D) {
  int64_t r0 = 0;
#ifdef VEC8
  if (D % 8 == 0) {
    for (; r0 + 8 <= n; r0 += 8)  // query rows three at a time
      for (int64_t g = 0; g < G; g += 3) {
        const float* qg = q + g * D;
        float* sg = s + g * ld;
#ifdef VEC16
        if (G - g >= 3) scores16<3>(qg, k, stride, r0, sg, ld, D);
        else if (G - g == 2) scores16<2>(qg, k, stride, r0, sg, ld, D);
        else scores16<1>(qg, k, stride, r0, sg, ld, D);
#else
        if (G - g >= 3) scores8<3>(qg, k, stride, r0, sg, ld, D);
        else if (G - g == 2) scores8<2>(qg, k, stride, r0, sg, ld, D);
        else scores8<1>(qg, k, stride, r0, sg, ld, D);
#endif
      }
  }
#endif
  for (int64_t r = r0; r < n; ++r)
    for (int64_t g = 0; g < G; ++g) {
      float x = 0.f;
      for (int64_t d = 0; d < D; ++d) x += q[g * D + d] * static_cast<float>(k[r * stride + d]);
      s[g * ld + r] = x;
    }
}

template <typename T>
static inline void prefetch(const T* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(reinterpret_cast<const char*>(p) + o);
}

// n rows of D elements, `stride` apart: one kv head's keys or values in a block
template <typename T>
static inline void prefetch_rows(const T* p, int64_t n, int64_t stride, int64_t D) {
  for (int64_t r = 0; r < n; ++r) prefetch(p + r * stride, D * (int64_t)sizeof(T));
}

// One task: one sequence, kv heads [h0, h1). A block holds bs rows of Hkv * D elements, contiguous;
// the task reads its heads' rows block by block. While it works on a head of one block it prefetches
// that head's keys (before the scores) and values (before the sums) of the next block of its table:
// a few dozen lines at a time, spread over the work, and only its own heads'. Prefetching the whole
// next block at once (384 lines for SmolLM2) was 1.4-1.6x slower: 30 layers, 8 sequences of 160
// (512) tokens, medians 5.0-5.9 (16.8) ms against 3.0-4.3 (10.7), bit-identical (scripts/attention_ab.py).
// Work buffers (floats): qf, acc (nh * D); s (G * bs); m, l (nh); nh = (h1 - h0) * G query heads.
template <typename T>
static void decode_task(const T* q, const T* kc, const T* vc, const int64_t* table, int64_t len, T* out,
                        int64_t H, int64_t Hkv, int64_t D, int64_t bs, int64_t h0, int64_t h1, float scale,
                        float* qf, float* acc, float* s, float* m, float* l) {
  const int64_t G = H / Hkv, nh = (h1 - h0) * G, stride = Hkv * D, block = bs * stride;
  for (int64_t i = 0; i < nh * D; ++i) qf[i] = static_cast<float>(q[h0 * G * D + i]) * scale;
  std::fill(acc, acc + nh * D, 0.f);
  std::fill(m, m + nh, -INFINITY);
  std::fill(l, l + nh, 0.f);
  for (int64_t t0 = 0; t0 < len; t0 += bs) {
    const int64_t n = std::min(bs, len - t0), blk = table[t0 / bs];
    const int64_t nn = std::min(bs, std::max<int64_t>(0, len - t0 - bs));  // rows of the next block
    const int64_t next = nn ? table[t0 / bs + 1] * block : 0;
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t i0 = (h - h0) * G;  // this kv head's G query heads: i0 .. i0 + G - 1
      const T* kb = kc + blk * block + h * D;
      prefetch_rows(kc + next + h * D, nn, stride, D);
      scores(qf + i0 * D, kb, stride, n, s, bs, G, D);
      for (int64_t g = 0; g < G; ++g) {  // online softmax: rescale what was summed so far
        float* sg = s + g * bs;
        const int64_t i = i0 + g;
        float mx = m[i];
        for (int64_t r = 0; r < n; ++r) mx = std::max(mx, sg[r]);
        const float c = std::exp(m[i] - mx);
        l[i] = l[i] * c + exp_shifted(sg, n, mx);
        m[i] = mx;
        for (int64_t d = 0; d < D; ++d) acc[i * D + d] *= c;
      }
      prefetch_rows(vc + next + h * D, nn, stride, D);
      accumulate(s, bs, 1, vc + blk * block + h * D, stride, n, acc + i0 * D, G, D);
    }
  }
  for (int64_t i = 0; i < nh; ++i) {
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    T* o = out + (h0 * G + i) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(acc[i * D + d] * inv);
  }
}

// Tasks: B x parts, where a sequence's kv heads are cut into `parts` ranges only when there are
// too few sequences to keep every thread busy. Contexts differ (a served batch mixes 50 and 2,000
// tokens), so the tasks are shared out in guided spans (`share`), not split evenly by count: a thread
// that drew short sequences takes more of them, and one the OS took away leaves the rest to the others.
template <typename T>
static void decode_impl(const T* q, const T* kc, const T* vc, const int64_t* tables, const int64_t* lens,
                        T* out, int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t bs, int64_t width,
                        float scale) {
  const int64_t threads = at::get_num_threads();
  const int64_t parts = std::min<int64_t>(Hkv, std::max<int64_t>(1, (4 * threads + B - 1) / B));
  const int64_t per = (Hkv + parts - 1) / parts, G = H / Hkv;
  share(B * parts, std::max<int64_t>(1, std::min(threads, B * parts)), 1, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(per * G * D), acc(per * G * D), s(G * bs), m(per * G), l(per * G);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / parts, h0 = (w % parts) * per, h1 = std::min(Hkv, h0 + per);
      if (h0 >= h1) continue;
      decode_task(q + b * H * D, kc, vc, tables + b * width, lens[b], out + b * H * D, H, Hkv, D, bs, h0, h1,
                  scale, qf.data(), acc.data(), s.data(), m.data(), l.data());
    }
  });
}

void decode(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor block_tables,
            at::Tensor seq_lens, double scale, at::Tensor out) {
  PROFILE("inferlab::attention_decode");
  TORCH_CHECK(q.is_contiguous() && out.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "decode: contiguous tensors expected");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong,
              "decode: int64 block tables and seq lens expected");
  TORCH_CHECK(block_tables.stride(1) == 1 && seq_lens.is_contiguous(), "decode: row-major tables expected");
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type()
              && out.scalar_type() == q.scalar_type(), "decode: q, caches and out must share a dtype");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), bs = k_cache.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && H % Hkv == 0 && block_tables.size(0) >= B && seq_lens.size(0) >= B,
              "decode: shape mismatch");
  const int64_t width = block_tables.stride(0);
  if (q.scalar_type() == at::kFloat) {
    decode_impl<float>(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                       block_tables.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(), out.data_ptr<float>(),
                       B, H, Hkv, D, bs, width, (float)scale);
  } else if (q.scalar_type() == at::kBFloat16) {
    using bf = at::BFloat16;
    decode_impl<bf>(q.data_ptr<bf>(), k_cache.data_ptr<bf>(), v_cache.data_ptr<bf>(),
                    block_tables.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(), out.data_ptr<bf>(),
                    B, H, Hkv, D, bs, width, (float)scale);
  } else {
    TORCH_CHECK(false, "decode: float32 or bfloat16 expected, got ", q.scalar_type());
  }
}

}  // namespace inferlab

"""C++ CPU kernels for attention over the paged KV cache, compiled on first use.

`decode(q, k_cache, v_cache, block_tables, seq_lens, scale, out)`: one query token per sequence,

    q (B, H, D), k_cache / v_cache (num_blocks, block_size, Hkv, D), block_tables (B, max_blocks) int64,
    seq_lens (B,) int64 context length (the query's own key included), out (B, H, D)

`prefill(...)`: chunks of several query tokens per sequence, causal — its source is in
`cpp_prefill.py` (appended to this one's: one extension, shared helpers).

Decode: one task per (sequence, kv head), spread over torch's intra-op threads (`at::parallel_for`). A task
walks its sequence's blocks through the block table, reading each key and value row of its kv
head once, for the H/Hkv query heads that share it (GQA), with an online softmax in float32; no
context is copied. fp32 or bf16 q/cache (bf16 is widened to fp32 as it is read); out has q's dtype.
The G query heads are register-blocked three at a time (`scores8`, `accumulate16`): each key and value
chunk is loaded once for them, and every sum keeps the order of the one-head-at-a-time loops, so the
results are bit-identical to them (SmolLM2, batch 8, context 170, one thread: 8.0 vs 9.0-12.9 ms per
30 layers, docs/perf/2026-12-02-served-decode-profile.md).

Built on first use by `cpu_build.load` (a C++ compiler with OpenMP; about 30 s the first time, then
cached on disk per CPU vector ISA).
"""
from __future__ import annotations

import functools

from reference_engine.attention import cpp_prefill
from reference_engine.kernels import cpu_build

SOURCE = cpu_build.HEADER + r"""
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

// acc_g += sum_r p[g * ld + r * sr] * v_r for GN rows, 16 columns from c: each value chunk is loaded
// once for the GN rows; every element still sums its terms in row order.
template <int GN, typename T>
static inline void accumulate16(const float* p, int64_t ld, int64_t sr, const T* v, int64_t stride, int64_t n,
                                float* acc, int64_t D, int64_t c) {
  __m256 a[GN][2];
  for (int g = 0; g < GN; ++g) {
    a[g][0] = _mm256_loadu_ps(acc + g * D + c);
    a[g][1] = _mm256_loadu_ps(acc + g * D + c + 8);
  }
  for (int64_t r = 0; r < n; ++r) {
    const __m256 v0 = load8(v + r * stride + c), v1 = load8(v + r * stride + c + 8);
    for (int g = 0; g < GN; ++g) {
      const __m256 pg = _mm256_set1_ps(p[g * ld + r * sr]);
      a[g][0] = _mm256_fmadd_ps(pg, v0, a[g][0]);
      a[g][1] = _mm256_fmadd_ps(pg, v1, a[g][1]);
    }
  }
  for (int g = 0; g < GN; ++g) {
    _mm256_storeu_ps(acc + g * D + c, a[g][0]);
    _mm256_storeu_ps(acc + g * D + c + 8, a[g][1]);
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
        if (G - g >= 3) scores8<3>(qg, k, stride, r0, sg, ld, D);
        else if (G - g == 2) scores8<2>(qg, k, stride, r0, sg, ld, D);
        else scores8<1>(qg, k, stride, r0, sg, ld, D);
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

// acc_g += sum_r p[g * ld + r * sr] * v_r for the G rows acc (G, D) and value rows v_r = v + r * stride
// (sr = 1: scores row-major, decode; sr = ld of the keys: key-major, prefill).
template <typename T>
static inline void accumulate(const float* p, int64_t ld, int64_t sr, const T* v, int64_t stride, int64_t n,
                              float* acc, int64_t G, int64_t D) {
#ifdef VEC8
  if (D % 16 == 0) {
    for (int64_t g = 0; g < G; g += 6)  // rows up to six at a time (12 accumulators)
      for (int64_t c = 0; c < D; c += 16) {
        const float* pg = p + g * ld;
        float* ag = acc + g * D;
        switch (std::min<int64_t>(6, G - g)) {
          case 6: accumulate16<6>(pg, ld, sr, v, stride, n, ag, D, c); break;
          case 5: accumulate16<5>(pg, ld, sr, v, stride, n, ag, D, c); break;
          case 4: accumulate16<4>(pg, ld, sr, v, stride, n, ag, D, c); break;
          case 3: accumulate16<3>(pg, ld, sr, v, stride, n, ag, D, c); break;
          case 2: accumulate16<2>(pg, ld, sr, v, stride, n, ag, D, c); break;
          default: accumulate16<1>(pg, ld, sr, v, stride, n, ag, D, c); break;
        }
      }
    return;
  }
  if (D % 8 == 0) {
    for (int64_t g = 0; g < G; ++g)
      for (int64_t c = 0; c < D; c += 8) {
        __m256 a = _mm256_loadu_ps(acc + g * D + c);
        for (int64_t r = 0; r < n; ++r)
          a = _mm256_fmadd_ps(_mm256_set1_ps(p[g * ld + r * sr]), load8(v + r * stride + c), a);
        _mm256_storeu_ps(acc + g * D + c, a);
      }
    return;
  }
#endif
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t d = 0; d < D; ++d) acc[g * D + d] += p[g * ld + r * sr] * static_cast<float>(v[r * stride + d]);
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
// too few sequences to keep every thread busy.
template <typename T>
static void decode_impl(const T* q, const T* kc, const T* vc, const int64_t* tables, const int64_t* lens,
                        T* out, int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t bs, int64_t width,
                        float scale) {
  const int64_t threads = at::get_num_threads();
  const int64_t parts = std::min<int64_t>(Hkv, std::max<int64_t>(1, (4 * threads + B - 1) / B));
  const int64_t per = (Hkv + parts - 1) / parts, G = H / Hkv;
  at::parallel_for(0, B * parts, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(per * G * D), acc(per * G * D), s(G * bs), m(per * G), l(per * G);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / parts, h0 = (w % parts) * per, h1 = std::min(Hkv, h0 + per);
      if (h0 >= h1) continue;
      decode_task(q + b * H * D, kc, vc, tables + b * width, lens[b], out + b * H * D, H, Hkv, D, bs, h0, h1,
                  scale, qf.data(), acc.data(), s.data(), m.data(), l.data());
    }
  });
}

void decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor block_tables,
            torch::Tensor seq_lens, double scale, torch::Tensor out) {
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
"""



@functools.cache
def module():
    """The compiled extension (built once per process; the build itself is cached on disk)."""
    return cpu_build.load("inferlab_cpu_attention", SOURCE + cpp_prefill.SOURCE, ["decode", "prefill"])

// What decode (attention_decode.cpp) and prefill (attention_prefill.cpp, attention_amx.cpp) attention share: the weighted
// sum of value rows, register-blocked over query rows, and the prefill kernels' task split (reference_engine/kernels/ops.py).
#pragma once

#include "common.h"

namespace inferlab {

#ifdef VEC8
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

#ifdef VEC16
// accumulate16 on one 512-bit vector a row (up to 12 rows at a time): the same sums, element by element
template <int GN, typename T>
static inline void accumulate16w(const float* p, int64_t ld, int64_t sr, const T* v, int64_t stride, int64_t n,
                                 float* acc, int64_t D, int64_t c) {
  __m512 a[GN];
  for (int g = 0; g < GN; ++g) a[g] = _mm512_loadu_ps(acc + g * D + c);
  for (int64_t r = 0; r < n; ++r) {
    const __m512 vr = load16(v + r * stride + c);
    for (int g = 0; g < GN; ++g) a[g] = _mm512_fmadd_ps(_mm512_set1_ps(p[g * ld + r * sr]), vr, a[g]);
  }
  for (int g = 0; g < GN; ++g) _mm512_storeu_ps(acc + g * D + c, a[g]);
}

template <int GN, typename T>  // the last gn < 12 rows: the row count picked at run time
static inline void accumulate16w_rows(int64_t gn, const float* p, int64_t ld, int64_t sr, const T* v, int64_t stride,
                                      int64_t n, float* acc, int64_t D, int64_t c) {
  if constexpr (GN > 0) {
    if (gn != GN) return accumulate16w_rows<GN - 1>(gn, p, ld, sr, v, stride, n, acc, D, c);
    accumulate16w<GN>(p, ld, sr, v, stride, n, acc, D, c);
  }
}
#endif

// acc_g += sum_r p[g * ld + r * sr] * v_r for the G rows acc (G, D) and value rows v_r = v + r * stride
// (sr = 1: scores row-major, decode; sr = ld of the keys: key-major, prefill).
template <typename T>
static inline void accumulate(const float* p, int64_t ld, int64_t sr, const T* v, int64_t stride, int64_t n,
                              float* acc, int64_t G, int64_t D) {
#ifdef VEC16
  if (D % 16 == 0) {
    for (int64_t g = 0; g < G; g += 12)
      for (int64_t c = 0; c < D; c += 16)
        accumulate16w_rows<12>(std::min<int64_t>(12, G - g), p + g * ld, ld, sr, v, stride, n, acc + g * D, D, c);
    return;
  }
#endif
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

// The prefill kernels' tasks, (sequence, first query row, kv head) in that order for chunks of `rows` query
// tokens, and each thread's contiguous run of them holding an equal share of the work (keys x rows), not of the
// task count: by count, one thread got the long tail of a single prompt (the last tiles see the most keys; 128
// tokens, 2 threads: 220 us against 160); handing tasks out heaviest first to whichever thread was free balanced
// that but scattered each thread's sequences (8 x 128 tokens: 1.33-1.56 against 1.27 ms). Which thread runs a
// task never changes its sums. run(tasks, w0, w1): one thread's run, tasks [w0, w1).
struct PrefillTask { int64_t b, r0, h; };

template <class F>
static inline void split_prefill(const int64_t* lens, const int64_t* starts, int64_t B, int64_t Hkv, int64_t rows,
                                 const F& run) {
  std::vector<PrefillTask> tasks;
  std::vector<int64_t> work{0};  // work[i]: the keys x rows of tasks [0, i)
  for (int64_t b = 0; b < B; ++b) {
    const int64_t qlen = starts[b + 1] - starts[b];
    for (int64_t r = 0; r < qlen; r += rows)
      for (int64_t h = 0; h < Hkv; ++h) {
        tasks.push_back({b, r, h});
        work.push_back(work.back() + (lens[b] - qlen + std::min(qlen, r + rows)) * std::min(rows, qlen - r));
      }
  }
  const int64_t nt = static_cast<int64_t>(tasks.size());
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), nt));
  // thread t's first task: the first whose preceding work reaches t / threads of the total
  auto first = [&](int64_t t) {
    return static_cast<int64_t>(std::lower_bound(work.begin(), work.end() - 1, work.back() * t / threads) - work.begin());
  };
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) { run(tasks, first(t0), first(t1)); });
}

}  // namespace inferlab

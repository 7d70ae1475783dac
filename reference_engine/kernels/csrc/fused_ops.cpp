// RMSNorm (with the residual add before it, or without), SiLU-and-multiply and rotary, one pass each (rounding: reference_engine/kernels/ops.py).
#include "common.h"
#include "kernels.h"

namespace inferlab {

template <typename T> static inline float f32(T v) { return static_cast<float>(v); }
template <typename T> static inline T to(float v) { return static_cast<T>(v); }
// v rounded to T's precision and widened back (a no-op for float)
template <typename T> static inline float rnd(float v) { return f32(to<T>(v)); }
static constexpr int64_t GRAIN = 1 << 14;  // elements per thread before a second thread pays


// out = RMSNorm(x) with weight w; with a residual addend a, x + a first (rounded to T, as PyTorch's add)
// and written to sum, then normalised: the same as the add and rms_norm one after the other
template <typename T>
static void rms_norm_impl(const T* x, int64_t xs, const T* a, T* sum, const T* w, T* out, int64_t N, int64_t H,
                          float eps) {
  at::parallel_for(0, N, std::max<int64_t>(1, GRAIN / H), [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const T* xr = x + n * xs;
      if (a) {  // this row of x + a, then normalise it
        const T* ar = a + n * H;
        T* sr = sum + n * H;
        int64_t i = 0;
#ifdef VEC16
        for (; i + 16 <= H; i += 16) store16(sr + i, _mm512_add_ps(load16(xr + i), load16(ar + i)));
#endif
#ifdef VEC8
        for (; i + 8 <= H; i += 8) store8(sr + i, _mm256_add_ps(load8(xr + i), load8(ar + i)));
#endif
        for (; i < H; ++i) sr[i] = to<T>(f32(xr[i]) + f32(ar[i]));
        xr = sr;
      }
      T* o = out + n * H;
      float ss = 0.f;
      int64_t i = 0;
#ifdef VEC8
      __m256 acc = _mm256_setzero_ps();
      for (; i + 8 <= H; i += 8) { const __m256 v = load8(xr + i); acc = _mm256_fmadd_ps(v, v, acc); }
      float lanes[8];
      _mm256_storeu_ps(lanes, acc);
      for (int k = 0; k < 8; ++k) ss += lanes[k];
#endif
      for (; i < H; ++i) ss += f32(xr[i]) * f32(xr[i]);
      const float r = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
      int64_t j = 0;
#ifdef VEC16  // the elementwise passes on 16 lanes (the same bits); the sum of squares above stays on 8
      const __m512 rw = _mm512_set1_ps(r);
      for (; j + 16 <= H; j += 16)
        store16(o + j, _mm512_mul_ps(load16(w + j), rnd16(_mm512_mul_ps(load16(xr + j), rw), xr)));
#endif
#ifdef VEC8
      const __m256 rv = _mm256_set1_ps(r);
      for (; j + 8 <= H; j += 8)
        store8(o + j, _mm256_mul_ps(load8(w + j), rnd8(_mm256_mul_ps(load8(xr + j), rv), xr)));
#endif
      for (; j < H; ++j) o[j] = to<T>(f32(w[j]) * rnd<T>(f32(xr[j]) * r));
    }
  });
}

// out = silu(g) * u, silu rounded to T first (HF: act_fn(gate) * up). sigmoid from e^-|g|, so
// exp8 only sees arguments <= 0.
template <typename T>
static void silu_mul_impl(const T* gu, int64_t gs, T* out, int64_t N, int64_t I) {
  at::parallel_for(0, N, std::max<int64_t>(1, GRAIN / I), [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const T* g = gu + n * gs;
      const T* u = g + I;
      T* o = out + n * I;
      int64_t i = 0;
#ifdef VEC16
      for (; i + 16 <= I; i += 16) {  // the 8-lane loop below, 16 lanes at a time: the same value per lane
        const __m512 x = load16(g + i);
        store16(o + i, _mm512_mul_ps(rnd16(_mm512_mul_ps(x, sigmoid16(x)), g), load16(u + i)));
      }
#endif
#ifdef VEC8
      const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
      for (; i + 8 <= I; i += 8) {
        const __m256 x = load8(g + i);
        const __m256 ex = exp8(_mm256_or_ps(x, sign));  // e^-|x|
        const __m256 den = _mm256_add_ps(one, ex);
        // sigmoid = 1 / den for x >= 0, e^-|x| / den for x < 0: x's sign picks the numerator, then one
        // division (the same quotient as dividing both and picking after)
        const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(one, ex, x), den);
        store8(o + i, _mm256_mul_ps(rnd8(_mm256_mul_ps(x, sig), g), load8(u + i)));
      }
#endif
      for (; i < I; ++i) {
        const float x = f32(g[i]);
        o[i] = to<T>(rnd<T>(x / (1.f + std::exp(-x))) * f32(u[i]));
      }
    }
  });
}

// x[n, h] <- x[n, h] * cos[n] + rotate_half(x[n, h]) * sin[n], in place. Each product and the sum
// rounded to T, as PyTorch's separate ops do; float32 is bit-identical to them (no contraction).
template <typename T>
static void rope_impl(T* x, int64_t xs, int64_t hs, const T* cos, const T* sin, int64_t N, int64_t heads,
                      int64_t D) {
  const int64_t half = D / 2;
  at::parallel_for(0, N, std::max<int64_t>(1, GRAIN / (heads * D)), [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const T* c = cos + n * D;
      const T* s = sin + n * D;
      for (int64_t h = 0; h < heads; ++h) {
        T* r = x + n * xs + h * hs;
        int64_t i = 0;
        [[maybe_unused]] const T* t = nullptr;  // picks rnd's rounding for T (the vector loops only)
#ifdef VEC16
        for (; i + 16 <= half; i += 16) {  // the scalar loop's steps, 16 lanes at a time: the same bits
          const __m512 x1 = load16(r + i), x2 = load16(r + i + half);
          const __m512 a = rnd16(_mm512_sub_ps(rnd16(_mm512_mul_ps(x1, load16(c + i)), t),
                                               rnd16(_mm512_mul_ps(x2, load16(s + i)), t)), t);
          const __m512 bb = rnd16(_mm512_add_ps(rnd16(_mm512_mul_ps(x2, load16(c + i + half)), t),
                                                rnd16(_mm512_mul_ps(x1, load16(s + i + half)), t)), t);
          store16(r + i, a);
          store16(r + i + half, bb);
        }
#endif
#ifdef VEC8
        for (; i + 8 <= half; i += 8) {
          const __m256 x1 = load8(r + i), x2 = load8(r + i + half);
          const __m256 a = rnd8(_mm256_sub_ps(rnd8(_mm256_mul_ps(x1, load8(c + i)), t),
                                              rnd8(_mm256_mul_ps(x2, load8(s + i)), t)), t);
          const __m256 bb = rnd8(_mm256_add_ps(rnd8(_mm256_mul_ps(x2, load8(c + i + half)), t),
                                               rnd8(_mm256_mul_ps(x1, load8(s + i + half)), t)), t);
          store8(r + i, a);
          store8(r + i + half, bb);
        }
#endif
        for (; i < half; ++i) {
          const float x1 = f32(r[i]), x2 = f32(r[i + half]);
          const float a = rnd<T>(rnd<T>(x1 * f32(c[i])) - rnd<T>(x2 * f32(s[i])));
          const float bb = rnd<T>(rnd<T>(x2 * f32(c[i + half])) + rnd<T>(x1 * f32(s[i + half])));
          r[i] = to<T>(a);
          r[i + half] = to<T>(bb);
        }
      }
    }
  });
}

#define DISPATCH(dtype, NAME, ...)                                                        \
  if ((dtype) == at::kFloat) { using T = float; NAME<T>(__VA_ARGS__); }                    \
  else if ((dtype) == at::kBFloat16) { using T = at::BFloat16; NAME<T>(__VA_ARGS__); }      \
  else TORCH_CHECK(false, #NAME ": float32 or bfloat16 expected, got ", dtype)

void rms_norm(at::Tensor x, at::Tensor w, double eps, at::Tensor out) {
  PROFILE("inferlab::rms_norm");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && out.is_contiguous() && w.is_contiguous(), "rms_norm: 2-d rows");
  TORCH_CHECK(w.scalar_type() == x.scalar_type() && out.scalar_type() == x.scalar_type() && w.numel() == x.size(1)
              && out.sizes() == x.sizes(), "rms_norm: x, w, out must agree");
  DISPATCH(x.scalar_type(), rms_norm_impl, x.data_ptr<T>(), x.stride(0), nullptr, nullptr, w.data_ptr<T>(),
           out.data_ptr<T>(), x.size(0), x.size(1), (float)eps);
}

void add_rms_norm(at::Tensor x, at::Tensor a, at::Tensor w, double eps, at::Tensor sum, at::Tensor out) {
  PROFILE("inferlab::add_rms_norm");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && a.is_contiguous() && sum.is_contiguous() && out.is_contiguous()
              && w.is_contiguous(), "add_rms_norm: 2-d rows");
  TORCH_CHECK(a.scalar_type() == x.scalar_type() && w.scalar_type() == x.scalar_type() && sum.scalar_type() ==
              x.scalar_type() && out.scalar_type() == x.scalar_type() && w.numel() == x.size(1) && a.sizes() ==
              x.sizes() && sum.sizes() == x.sizes() && out.sizes() == x.sizes(), "add_rms_norm: x, a, w, sum, out must agree");
  DISPATCH(x.scalar_type(), rms_norm_impl, x.data_ptr<T>(), x.stride(0), a.data_ptr<T>(), sum.data_ptr<T>(),
           w.data_ptr<T>(), out.data_ptr<T>(), x.size(0), x.size(1), (float)eps);
}

void silu_mul(at::Tensor gu, at::Tensor out) {
  PROFILE("inferlab::silu_mul");
  TORCH_CHECK(gu.dim() == 2 && gu.stride(1) == 1 && out.is_contiguous() && gu.size(1) == 2 * out.size(1)
              && gu.size(0) == out.size(0) && gu.scalar_type() == out.scalar_type(), "silu_mul: shapes");
  DISPATCH(gu.scalar_type(), silu_mul_impl, gu.data_ptr<T>(), gu.stride(0), out.data_ptr<T>(), gu.size(0),
           out.size(1));
}

void rope_(at::Tensor x, at::Tensor cos, at::Tensor sin) {
  PROFILE("inferlab::rope_");
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && cos.is_contiguous() && sin.is_contiguous(), "rope_: layout");
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type()
              && cos.numel() == x.size(0) * x.size(2) && sin.numel() == cos.numel() && x.size(2) % 2 == 0,
              "rope_: x (N, heads, D) and cos/sin (N, D) of its dtype");
  DISPATCH(x.scalar_type(), rope_impl, x.data_ptr<T>(), x.stride(0), x.stride(1), cos.data_ptr<T>(),
           sin.data_ptr<T>(), x.size(0), x.size(1), x.size(2));
}

}  // namespace inferlab

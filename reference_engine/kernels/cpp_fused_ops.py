"""C++ CPU kernels for the decoder's element-wise stages, each one pass over memory.

PyTorch runs RMSNorm as six ops (cast, square, mean, add, rsqrt, two multiplies), rotary
embedding as eight (two rotations: slice, negate, cat, two multiplies, add) and SiLU-and-multiply
as three, each a separate pass with its own intermediate tensor and its own OpenMP fork. For a
decode batch those passes cost more than their arithmetic; fused, each stage reads its input once.

    rms_norm(x (N, H), w (H,), eps, out (N, H))      out = w * (x / sqrt(mean(x^2) + eps)) [HF's order]
    silu_mul(gu (N, 2I), out (N, I))                  out = silu(gu[:, :I]) * gu[:, I:]
    rope_(x (N, heads, D) strided rows, cos, sin (N, D))   in place: x * cos + rotate_half(x) * sin

fp32 or bf16 tensors (bf16 read as fp32, rounded back where HF rounds: after the normalisation and
after the weight multiply; each rotary product and the sum). Float32 results equal PyTorch's up to
the summation order of RMSNorm's mean and SiLU's exp (the rotary kernel is bit-identical: built
without contracted multiply-adds, see cpu_build.load). Rows are spread over torch's intra-op
threads only when there are enough of them (`at::parallel_for`'s grain), so a small decode batch
runs on the calling thread with no fork.
"""
from __future__ import annotations

import functools

from reference_engine.kernels import cpu_build

SOURCE = cpu_build.HEADER + r"""
template <typename T> static inline float f32(T v) { return static_cast<float>(v); }
template <typename T> static inline T to(float v) { return static_cast<T>(v); }
// v rounded to T's precision and widened back (a no-op for float)
template <typename T> static inline float rnd(float v) { return f32(to<T>(v)); }
static constexpr int64_t GRAIN = 1 << 14;  // elements per thread before a second thread pays

#ifdef VEC8
static inline __m256 rnd8(__m256 v, const float*) { return v; }
static inline __m256 rnd8(__m256 v, const at::BFloat16*) {  // to bf16 (nearest even) and back
  __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  b = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  return _mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
#endif

template <typename T>
static void rms_norm_impl(const T* x, int64_t xs, const T* w, T* out, int64_t N, int64_t H, float eps) {
  at::parallel_for(0, N, std::max<int64_t>(1, GRAIN / H), [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const T* xr = x + n * xs;
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
#ifdef VEC8
      const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
      for (; i + 8 <= I; i += 8) {
        const __m256 x = load8(g + i);
        const __m256 ex = exp8(_mm256_or_ps(x, sign));  // e^-|x|
        const __m256 den = _mm256_add_ps(one, ex);
        const __m256 sig = _mm256_blendv_ps(_mm256_div_ps(one, den), _mm256_div_ps(ex, den), x);  // x's sign picks
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
        for (int64_t i = 0; i < half; ++i) {
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

void rms_norm(torch::Tensor x, torch::Tensor w, double eps, torch::Tensor out) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && out.is_contiguous() && w.is_contiguous(), "rms_norm: 2-d rows");
  TORCH_CHECK(w.scalar_type() == x.scalar_type() && out.scalar_type() == x.scalar_type() && w.numel() == x.size(1)
              && out.sizes() == x.sizes(), "rms_norm: x, w, out must agree");
  DISPATCH(x.scalar_type(), rms_norm_impl, x.data_ptr<T>(), x.stride(0), w.data_ptr<T>(), out.data_ptr<T>(),
           x.size(0), x.size(1), (float)eps);
}

void silu_mul(torch::Tensor gu, torch::Tensor out) {
  TORCH_CHECK(gu.dim() == 2 && gu.stride(1) == 1 && out.is_contiguous() && gu.size(1) == 2 * out.size(1)
              && gu.size(0) == out.size(0) && gu.scalar_type() == out.scalar_type(), "silu_mul: shapes");
  DISPATCH(gu.scalar_type(), silu_mul_impl, gu.data_ptr<T>(), gu.stride(0), out.data_ptr<T>(), gu.size(0),
           out.size(1));
}

void rope_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && cos.is_contiguous() && sin.is_contiguous(), "rope_: layout");
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type()
              && cos.numel() == x.size(0) * x.size(2) && sin.numel() == cos.numel() && x.size(2) % 2 == 0,
              "rope_: x (N, heads, D) and cos/sin (N, D) of its dtype");
  DISPATCH(x.scalar_type(), rope_impl, x.data_ptr<T>(), x.stride(0), x.stride(1), cos.data_ptr<T>(),
           sin.data_ptr<T>(), x.size(0), x.size(1), x.size(2));
}
"""


@functools.cache
def module():
    """The compiled extension (built once per process; the build itself is cached on disk)."""
    return cpu_build.load("inferlab_cpu_ops", SOURCE, ["rms_norm", "silu_mul", "rope_"])

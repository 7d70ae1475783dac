// The vector lanes every kernel computes on, each defined once: helpers on 8 fp32 lanes (AVX2 + FMA, also
// under AVX-512) and on 16 (AVX-512): fp32 and bf16 loads and stores, the bf16 rounding, sums, exp; `Vec<W>`,
// W lanes as one type (W = 1: scalar), for a kernel written once over the width; and the bf16 GEMM's pair
// step (`Widen`, `Dp`). Per lane, every width runs the same operations, so the builds give the same bits.
#pragma once

#include <c10/util/BFloat16.h>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VEC8 1  // 8-lane helpers below; the kernels keep a scalar path with the same sums where it can
#endif

namespace inferlab {

#ifdef VEC8
// fp32 -> bf16 bits, round to nearest even (what at::BFloat16's constructor does for finite values),
// left in the high half of each 32-bit lane: the one rounding every bf16 store and re-round uses.
static inline __m256i round_bf16(__m256 v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
}
static inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8(const at::BFloat16* p) {  // bf16 -> fp32: the 16 bits are the high half
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
static inline void store8(at::BFloat16* p, __m256 v) {
  const __m256i b = _mm256_srli_epi32(round_bf16(v), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}
// v rounded to the precision of T's elements and widened back (a no-op for float)
static inline __m256 rnd8(__m256 v, const float*) { return v; }
static inline __m256 rnd8(__m256 v, const at::BFloat16*) {
  return _mm256_castsi256_ps(_mm256_and_si256(round_bf16(v), _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
// lane r of the result = the sum of the 8 lanes of a[r]
static inline __m256 reduce8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}
// e^x for x <= 0 (Cephes' expf: exp(x) = 2^n e^r, |r| <= ln2/2, degree-5 polynomial; ~1 ulp)
static inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

#if defined(__AVX512F__)
#define VEC16 1  // 16-lane helpers (the AVX-512 build): the same per-lane operations as the 8-lane ones
static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const at::BFloat16* p) {  // bf16 -> fp32: the 16 bits are the high half
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline __m512i round_bf16(__m512 v) {  // round_bf16 above, 16 lanes
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
}
static inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
static inline void store16(at::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(round_bf16(v), 16)));
}
static inline __m512 rnd16(__m512 v, const float*) { return v; }
static inline __m512 rnd16(__m512 v, const at::BFloat16*) {
  return _mm512_castsi512_ps(_mm512_and_si512(round_bf16(v), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
// exp8 on 16 lanes: the same steps and constants, so the same value in every lane
static inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  __m512 n = _mm512_floor_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)));
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  for (const float c : {1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f})
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(c));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
// sigmoid(x) from e^-|x| (so exp16 only sees arguments <= 0): 1 / den for x >= 0, e^-|x| / den for x < 0,
// den = 1 + e^-|x|; x's sign picks the numerator, then one division. SiLU is x times it.
static inline __m512 sigmoid16(__m512 x) {
  const __m512 ex = exp16(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
  const __m512 one = _mm512_set1_ps(1.f), den = _mm512_add_ps(one, ex);
  const __mmask16 neg = _mm512_movepi32_mask(_mm512_castps_si512(x));  // x's sign bit (blendv's choice)
  return _mm512_div_ps(_mm512_mask_blend_ps(neg, one, ex), den);
}
#endif

static inline float pair_hi(uint32_t v) { float f; v &= 0xffff0000u; std::memcpy(&f, &v, 4); return f; }  // x[2i+1]
static inline float pair_lo(uint32_t v) { float f; v <<= 16; std::memcpy(&f, &v, 4); return f; }           // x[2i]

// W fp32 lanes: zero, load, store, set1 (broadcast), fma (one rounding: the scalar lane is std::fma), and
// widen: W bf16 pairs (x[2i], x[2i+1]) as two vectors of fp32, h = the odd elements, l = the even (exact)
template <int W_>
struct Vec;

template <>
struct Vec<1> {
  static constexpr int W = 1;
  using T = float;
  struct Pair { T h, l; };
  static T zero() { return 0.f; }
  static T load(const float* p) { return *p; }
  static void store(float* p, T v) { *p = v; }
  static T set1(float v) { return v; }
  static T fma(T a, T b, T c) { return std::fma(a, b, c); }
  static Pair widen(const uint32_t* q) { return {pair_hi(*q), pair_lo(*q)}; }
};

#ifdef VEC8
template <>
struct Vec<8> {
  static constexpr int W = 8;
  using T = __m256;
  struct Pair { T h, l; };
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T set1(float v) { return _mm256_set1_ps(v); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static Pair widen(const uint32_t* q) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    return {_mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u)))),
            _mm256_castsi256_ps(_mm256_slli_epi32(v, 16))};
  }
};
#endif

#ifdef VEC16
template <>
struct Vec<16> {
  static constexpr int W = 16;
  using T = __m512;
  struct Pair { T h, l; };
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T set1(float v) { return _mm512_set1_ps(v); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static Pair widen(const uint32_t* q) {
    const __m512i v = _mm512_loadu_si512(q);
    return {_mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))),
            _mm512_castsi512_ps(_mm512_slli_epi32(v, 16))};
  }
};
using Widest = Vec<16>;  // the widest lanes this build has
#elif defined(VEC8)
using Widest = Vec<8>;
#else
using Widest = Vec<1>;
#endif

// The bf16 GEMM's pair step, acc = fma(x[2i], w[2i], fma(x[2i+1], w[2i+1], acc)): vdpbf16ps' order (Intel SDM;
// each product of two bf16 is exact in fp32). Widen runs it as two FMAs on V's lanes, each pair widened to
// fp32; Dp runs vdpbf16ps itself (AVX512_BF16), the same bits except where it flushes denormals to zero.
template <class V>
struct Widen : V {
  using Acc = typename V::T;
  using Wv = typename V::Pair;  // a loaded weight vector
  using Xb = typename V::Pair;  // a broadcast pair of x
  static Wv loadw(const uint32_t* q) { return V::widen(q); }
  static Xb bcast(uint32_t v) { return {V::set1(pair_hi(v)), V::set1(pair_lo(v))}; }
  static Acc step(Acc a, const Xb& x, const Wv& w) { return V::fma(x.l, w.l, V::fma(x.h, w.h, a)); }
};

#ifdef VEC16
#define BF16_TARGET __attribute__((target("avx512f,avx512bf16")))
struct Dp : Vec<16> {  // 32 products per instruction
  using Acc = __m512;
  using Wv = __m512i;
  using Xb = __m512i;
  BF16_TARGET static Wv loadw(const uint32_t* q) { return _mm512_loadu_si512(q); }
  BF16_TARGET static Xb bcast(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }
  BF16_TARGET static Acc step(Acc a, Xb x, Wv w) { return _mm512_dpbf16_ps(a, (__m512bh)x, (__m512bh)w); }
};
#endif

}  // namespace inferlab

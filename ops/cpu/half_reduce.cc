// float16/bfloat16 reduction and scaling, one fused pass: widen, combine in float, narrow, per
// element, so nothing goes through a staging buffer. Per dispatch level (simd_level.h):
//  - baseline: the portable loops (bit-level conversions, half_bits.h), auto-vectorised for SSE2;
//  - AVX2: float16 through F16C's conversions, 8 lanes; bfloat16 the portable loops compiled for
//    AVX2 (SSE2 has no 32->16-bit pack, which makes narrowing slow there);
//  - AVX-512: float16 through the 16-lane conversions; bfloat16 the portable loops compiled for
//    AVX-512. AVX512_BF16's vcvtneps2bf16 is not used: it flushes subnormal inputs and results to
//    zero, which the other levels do not.
// vcvtps2ph with an explicit round-to-nearest-even gives the portable FloatToHalf's bits for every
// float, NaNs included (quiet, top payload bits kept); vcvtph2ps those of HalfToFloat (the tests
// check every value).
#include <algorithm>
#include <cstring>

#include "ops/cpu/half_bits.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/simd_level.h"

#ifdef HVDC_HAVE_X86
#include <immintrin.h>
#endif

namespace hvdc {
namespace cpu {
namespace {

struct Fp16 {
  static float Load(uint16_t h) { return bits::HalfToFloat(h); }
  static uint16_t Store(float f) { return bits::FloatToHalf(f); }
};

struct Bf16 {
  static float Load(uint16_t b) { return bits::Bfloat16ToFloat(b); }
  static uint16_t Store(float f) { return bits::FloatToBfloat16(f); }
};

template <typename Fmt, typename F>
inline void ReduceWith(uint16_t* d, const uint16_t* s, int64_t n, F f) {
  loops::Zip(d, s, n,
             [f](uint16_t a, uint16_t b) { return Fmt::Store(f(Fmt::Load(a), Fmt::Load(b))); });
}

// Min/Max keep dst unless src compares smaller/larger, as the native kernels do.
template <typename Fmt>
inline void Reduce(uint16_t* d, const uint16_t* s, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return ReduceWith<Fmt>(d, s, n, [](float a, float b) { return b < a ? b : a; });
    case ReduceOp::kMax:
      return ReduceWith<Fmt>(d, s, n, [](float a, float b) { return b > a ? b : a; });
    case ReduceOp::kProduct:
      return ReduceWith<Fmt>(d, s, n, [](float a, float b) { return a * b; });
    default:  // Sum, and Average (folded into a postscale by the caller)
      return ReduceWith<Fmt>(d, s, n, [](float a, float b) { return a + b; });
  }
}

template <typename Fmt>
inline void Scale(uint16_t* d, const uint16_t* s, int64_t n, float factor) {
  loops::Map(d, s, n, [factor](uint16_t x) { return Fmt::Store(Fmt::Load(x) * factor); });
}

#ifdef HVDC_HAVE_X86

// Explicit loads and stores (so dst == src needs no special case); a tail shorter than a vector
// goes through a zero-padded copy.
template <int kLanes>
struct Tail {
  Tail(const uint16_t* dst, const uint16_t* src, int64_t n)
      : bytes(static_cast<size_t>(n) * sizeof(uint16_t)) {
    std::memcpy(d, dst, bytes);
    std::memcpy(s, src, bytes);
  }
  void CopyOut(uint16_t* dst) const { std::memcpy(dst, d, bytes); }
  alignas(64) uint16_t d[kLanes] = {};
  alignas(64) uint16_t s[kLanes] = {};
  size_t bytes;
};

// min/max(b, a) is b < a ? b : a and b > a ? b : a (a when either is NaN), as in Reduce above.
HVDC_TARGET_AVX2 inline __m256 LoadHalf8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

HVDC_TARGET_AVX2 inline void StoreHalf8(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

template <ReduceOp kOp>
HVDC_TARGET_AVX2 inline void ReduceHalf8(uint16_t* d, const uint16_t* s) {
  const __m256 a = LoadHalf8(d);
  const __m256 b = LoadHalf8(s);
  if constexpr (kOp == ReduceOp::kMin) {
    StoreHalf8(d, _mm256_min_ps(b, a));
  } else if constexpr (kOp == ReduceOp::kMax) {
    StoreHalf8(d, _mm256_max_ps(b, a));
  } else if constexpr (kOp == ReduceOp::kProduct) {
    StoreHalf8(d, _mm256_mul_ps(a, b));
  } else {
    StoreHalf8(d, _mm256_add_ps(a, b));
  }
}

template <ReduceOp kOp>
HVDC_TARGET_AVX2 void ReduceF16C(uint16_t* d, const uint16_t* s, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) ReduceHalf8<kOp>(d + i, s + i);
  if (i < n) {
    Tail<8> tail(d + i, s + i, n - i);
    ReduceHalf8<kOp>(tail.d, tail.s);
    tail.CopyOut(d + i);
  }
}

HVDC_TARGET_AVX2 void ScaleF16C(uint16_t* d, const uint16_t* s, int64_t n, float factor) {
  const __m256 f = _mm256_set1_ps(factor);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) StoreHalf8(d + i, _mm256_mul_ps(LoadHalf8(s + i), f));
  if (i < n) {
    Tail<8> tail(d + i, s + i, n - i);
    StoreHalf8(tail.d, _mm256_mul_ps(LoadHalf8(tail.s), f));
    tail.CopyOut(d + i);
  }
}

// Zero-masked forms with every lane selected (the same instructions): the unmasked ones trip GCC
// 12's -Wmaybe-uninitialized on their undefined pass-through operand (GCC bug 105593).
constexpr __mmask16 kAll16 = 0xffff;

HVDC_TARGET_AVX512 inline __m512 LoadHalf16(const uint16_t* p) {
  return _mm512_maskz_cvtph_ps(kAll16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

HVDC_TARGET_AVX512 inline void StoreHalf16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_maskz_cvtps_ph(kAll16, v, _MM_FROUND_TO_NEAREST_INT));
}

template <ReduceOp kOp>
HVDC_TARGET_AVX512 inline void ReduceHalf16(uint16_t* d, const uint16_t* s) {
  const __m512 a = LoadHalf16(d);
  const __m512 b = LoadHalf16(s);
  if constexpr (kOp == ReduceOp::kMin) {
    StoreHalf16(d, _mm512_maskz_min_ps(kAll16, b, a));
  } else if constexpr (kOp == ReduceOp::kMax) {
    StoreHalf16(d, _mm512_maskz_max_ps(kAll16, b, a));
  } else if constexpr (kOp == ReduceOp::kProduct) {
    StoreHalf16(d, _mm512_maskz_mul_ps(kAll16, a, b));
  } else {
    StoreHalf16(d, _mm512_maskz_add_ps(kAll16, a, b));
  }
}

// 16 lanes, the last fewer than 16 through the 8-lane path.
template <ReduceOp kOp>
HVDC_TARGET_AVX512 void ReduceF16C512(uint16_t* d, const uint16_t* s, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) ReduceHalf16<kOp>(d + i, s + i);
  if (i < n) ReduceF16C<kOp>(d + i, s + i, n - i);
}

HVDC_TARGET_AVX512 void ScaleF16C512(uint16_t* d, const uint16_t* s, int64_t n, float factor) {
  const __m512 f = _mm512_set1_ps(factor);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    StoreHalf16(d + i, _mm512_maskz_mul_ps(kAll16, LoadHalf16(s + i), f));
  if (i < n) ScaleF16C(d + i, s + i, n - i, factor);
}

// The op as a template argument, chosen once per call.
template <template <ReduceOp> class Kernel>
inline void WithOp(ReduceOp op, uint16_t* d, const uint16_t* s, int64_t n) {
  switch (op) {
    case ReduceOp::kMin:
      return Kernel<ReduceOp::kMin>::Run(d, s, n);
    case ReduceOp::kMax:
      return Kernel<ReduceOp::kMax>::Run(d, s, n);
    case ReduceOp::kProduct:
      return Kernel<ReduceOp::kProduct>::Run(d, s, n);
    default:  // Sum, and Average (folded into a postscale by the caller)
      return Kernel<ReduceOp::kSum>::Run(d, s, n);
  }
}

template <ReduceOp kOp>
struct F16C256 {
  static void Run(uint16_t* d, const uint16_t* s, int64_t n) { ReduceF16C<kOp>(d, s, n); }
};

template <ReduceOp kOp>
struct F16C512 {
  static void Run(uint16_t* d, const uint16_t* s, int64_t n) { ReduceF16C512<kOp>(d, s, n); }
};

// flatten: every template above is inlined, so it is compiled for the function's target.
HVDC_TARGET_AVX2 __attribute__((flatten)) void ReduceAvx2(uint16_t* d, const uint16_t* s, int64_t n,
                                                          ReduceOp op, bool bf16) {
  bf16 ? Reduce<Bf16>(d, s, n, op) : WithOp<F16C256>(op, d, s, n);
}

HVDC_TARGET_AVX2 __attribute__((flatten)) void ScaleAvx2(uint16_t* d, const uint16_t* s, int64_t n,
                                                         float factor, bool bf16) {
  bf16 ? Scale<Bf16>(d, s, n, factor) : ScaleF16C(d, s, n, factor);
}

HVDC_TARGET_AVX512 __attribute__((flatten)) void ReduceAvx512(uint16_t* d, const uint16_t* s,
                                                              int64_t n, ReduceOp op, bool bf16) {
  bf16 ? Reduce<Bf16>(d, s, n, op) : WithOp<F16C512>(op, d, s, n);
}

HVDC_TARGET_AVX512 __attribute__((flatten)) void ScaleAvx512(uint16_t* d, const uint16_t* s,
                                                             int64_t n, float factor, bool bf16) {
  bf16 ? Scale<Bf16>(d, s, n, factor) : ScaleF16C512(d, s, n, factor);
}

#endif  // HVDC_HAVE_X86

__attribute__((flatten)) void ReduceBaseline(uint16_t* d, const uint16_t* s, int64_t n, ReduceOp op,
                                             bool bf16) {
  bf16 ? Reduce<Bf16>(d, s, n, op) : Reduce<Fp16>(d, s, n, op);
}

__attribute__((flatten)) void ScaleBaseline(uint16_t* d, const uint16_t* s, int64_t n, float factor,
                                            bool bf16) {
  bf16 ? Scale<Bf16>(d, s, n, factor) : Scale<Fp16>(d, s, n, factor);
}

}  // namespace

void ReduceHalfLikeAt(SimdLevel level, uint16_t* dst, const uint16_t* src, int64_t n, ReduceOp op,
                      bool bf16) {
  switch (std::min(level, SupportedSimdLevel())) {
#ifdef HVDC_HAVE_X86
    case SimdLevel::kAvx512:
      return ReduceAvx512(dst, src, n, op, bf16);
    case SimdLevel::kAvx2:
      return ReduceAvx2(dst, src, n, op, bf16);
#endif
    default:
      return ReduceBaseline(dst, src, n, op, bf16);
  }
}

void ScaleHalfLikeAt(SimdLevel level, uint16_t* dst, const uint16_t* src, int64_t n, float factor,
                     bool bf16) {
  switch (std::min(level, SupportedSimdLevel())) {
#ifdef HVDC_HAVE_X86
    case SimdLevel::kAvx512:
      return ScaleAvx512(dst, src, n, factor, bf16);
    case SimdLevel::kAvx2:
      return ScaleAvx2(dst, src, n, factor, bf16);
#endif
    default:
      return ScaleBaseline(dst, src, n, factor, bf16);
  }
}

}  // namespace cpu
}  // namespace hvdc

// float16/bfloat16 reduction and scaling, one fused pass: widen, combine in float, narrow, per
// element, so nothing goes through a staging buffer. The portable loops are compiled twice, for
// baseline x86-64 and for AVX2 (chosen at run time): baseline SSE2 has no 32->16-bit pack, which
// makes narrowing slow there. float16 uses F16C's conversion instructions when the CPU has them.
#include <cstring>

#include "ops/cpu/half_bits.h"
#include "ops/cpu/loops.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HVDC_HAVE_X86 1
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

// F16C: 8 halves at a time, with explicit loads and stores (so dst == src needs no special case).
// A tail of fewer than 8 goes through a zero-padded copy.
struct Tail {
  Tail(const uint16_t* dst, const uint16_t* src, int64_t n)
      : bytes(static_cast<size_t>(n) * sizeof(uint16_t)) {
    std::memcpy(d, dst, bytes);
    std::memcpy(s, src, bytes);
  }
  void CopyOut(uint16_t* dst) const { std::memcpy(dst, d, bytes); }
  alignas(16) uint16_t d[8] = {};
  alignas(16) uint16_t s[8] = {};
  size_t bytes;
};

__attribute__((target("avx,f16c"))) inline __m256 LoadHalf8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

__attribute__((target("avx,f16c"))) inline void StoreHalf8(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

template <ReduceOp kOp>
__attribute__((target("avx,f16c"))) inline void ReduceHalf8(uint16_t* d, const uint16_t* s) {
  const __m256 a = LoadHalf8(d);
  const __m256 b = LoadHalf8(s);
  if constexpr (kOp == ReduceOp::kMin) {
    StoreHalf8(d, _mm256_min_ps(b, a));  // b < a ? b : a
  } else if constexpr (kOp == ReduceOp::kMax) {
    StoreHalf8(d, _mm256_max_ps(b, a));  // b > a ? b : a
  } else if constexpr (kOp == ReduceOp::kProduct) {
    StoreHalf8(d, _mm256_mul_ps(a, b));
  } else {
    StoreHalf8(d, _mm256_add_ps(a, b));
  }
}

template <ReduceOp kOp>
__attribute__((target("avx,f16c"))) void ReduceF16C(uint16_t* d, const uint16_t* s, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) ReduceHalf8<kOp>(d + i, s + i);
  if (i < n) {
    Tail tail(d + i, s + i, n - i);
    ReduceHalf8<kOp>(tail.d, tail.s);
    tail.CopyOut(d + i);
  }
}

__attribute__((target("avx,f16c"))) void ScaleF16C(uint16_t* d, const uint16_t* s, int64_t n,
                                                   float factor) {
  const __m256 f = _mm256_set1_ps(factor);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) StoreHalf8(d + i, _mm256_mul_ps(LoadHalf8(s + i), f));
  if (i < n) {
    Tail tail(d + i, s + i, n - i);
    StoreHalf8(tail.d, _mm256_mul_ps(LoadHalf8(tail.s), f));
    tail.CopyOut(d + i);
  }
}

#endif  // HVDC_HAVE_X86

}  // namespace

// flatten: every template above is inlined, so it is compiled for the function's target.
__attribute__((flatten)) void ReduceHalfLikeBaseline(uint16_t* d, const uint16_t* s, int64_t n,
                                                     ReduceOp op, bool bf16) {
  bf16 ? Reduce<Bf16>(d, s, n, op) : Reduce<Fp16>(d, s, n, op);
}

__attribute__((flatten)) void ScaleHalfLikeBaseline(uint16_t* d, const uint16_t* s, int64_t n,
                                                    float factor, bool bf16) {
  bf16 ? Scale<Bf16>(d, s, n, factor) : Scale<Fp16>(d, s, n, factor);
}

#ifdef HVDC_HAVE_X86

__attribute__((target("avx2"), flatten)) void ReduceHalfLikeAvx2(uint16_t* d, const uint16_t* s,
                                                                 int64_t n, ReduceOp op,
                                                                 bool bf16) {
  bf16 ? Reduce<Bf16>(d, s, n, op) : Reduce<Fp16>(d, s, n, op);
}

__attribute__((target("avx2"), flatten)) void ScaleHalfLikeAvx2(uint16_t* d, const uint16_t* s,
                                                                int64_t n, float factor,
                                                                bool bf16) {
  bf16 ? Scale<Bf16>(d, s, n, factor) : Scale<Fp16>(d, s, n, factor);
}

#else

void ReduceHalfLikeAvx2(uint16_t* d, const uint16_t* s, int64_t n, ReduceOp op, bool bf16) {
  ReduceHalfLikeBaseline(d, s, n, op, bf16);
}
void ScaleHalfLikeAvx2(uint16_t* d, const uint16_t* s, int64_t n, float factor, bool bf16) {
  ScaleHalfLikeBaseline(d, s, n, factor, bf16);
}

#endif  // HVDC_HAVE_X86

void ReduceHalfLike(uint16_t* dst, const uint16_t* src, int64_t n, ReduceOp op, bool bf16) {
#ifdef HVDC_HAVE_X86
  if (!bf16 && HaveF16C()) {
    switch (op) {
      case ReduceOp::kMin:
        return ReduceF16C<ReduceOp::kMin>(dst, src, n);
      case ReduceOp::kMax:
        return ReduceF16C<ReduceOp::kMax>(dst, src, n);
      case ReduceOp::kProduct:
        return ReduceF16C<ReduceOp::kProduct>(dst, src, n);
      default:
        return ReduceF16C<ReduceOp::kSum>(dst, src, n);
    }
  }
#endif
  if (HaveAvx2()) return ReduceHalfLikeAvx2(dst, src, n, op, bf16);
  ReduceHalfLikeBaseline(dst, src, n, op, bf16);
}

void ScaleHalfLike(uint16_t* dst, const uint16_t* src, int64_t n, float factor, bool bf16) {
#ifdef HVDC_HAVE_X86
  if (!bf16 && HaveF16C()) return ScaleF16C(dst, src, n, factor);
#endif
  if (HaveAvx2()) return ScaleHalfLikeAvx2(dst, src, n, factor, bf16);
  ScaleHalfLikeBaseline(dst, src, n, factor, bf16);
}

}  // namespace cpu
}  // namespace hvdc

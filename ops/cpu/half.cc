// float16/bfloat16 conversions: the scalar entry points and the array conversions.
#include "ops/cpu/half_bits.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/simd_level.h"

#ifdef HVDC_HAVE_X86
#include <immintrin.h>
#endif

namespace hvdc {
namespace cpu {
namespace {

// In blocks of loops::kBlock, for the vectoriser (see loops.h).
template <typename In, typename Out, typename F>
inline void ConvertLoop(const In* __restrict in, Out* __restrict out, int64_t n, F convert) {
  constexpr int64_t kBlock = loops::kBlock;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (int64_t j = 0; j < kBlock; ++j) out[i + j] = convert(in[i + j]);
  }
  for (; i < n; ++i) out[i] = convert(in[i]);
}

}  // namespace

float HalfToFloat(uint16_t h) { return bits::HalfToFloat(h); }
uint16_t FloatToHalf(float f) { return bits::FloatToHalf(f); }
float Bfloat16ToFloat(uint16_t b) { return bits::Bfloat16ToFloat(b); }
uint16_t FloatToBfloat16(float f) { return bits::FloatToBfloat16(f); }

void HalfToFloatNPortable(const uint16_t* in, float* out, int64_t n) {
  ConvertLoop(in, out, n, [](uint16_t h) { return bits::HalfToFloat(h); });
}

void FloatToHalfNPortable(const float* in, uint16_t* out, int64_t n) {
  ConvertLoop(in, out, n, [](float f) { return bits::FloatToHalf(f); });
}

void Bfloat16ToFloatN(const uint16_t* in, float* out, int64_t n) {
  ConvertLoop(in, out, n, [](uint16_t b) { return bits::Bfloat16ToFloat(b); });
}

void FloatToBfloat16N(const float* in, uint16_t* out, int64_t n) {
  ConvertLoop(in, out, n, [](float f) { return bits::FloatToBfloat16(f); });
}

#ifdef HVDC_HAVE_X86

__attribute__((target("avx,f16c"))) void HalfToFloatNF16C(const uint16_t* in, float* out,
                                                          int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = bits::HalfToFloat(in[i]);
}

__attribute__((target("avx,f16c"))) void FloatToHalfNF16C(const float* in, uint16_t* out,
                                                          int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = bits::FloatToHalf(in[i]);
}

#else

void HalfToFloatNF16C(const uint16_t* in, float* out, int64_t n) {
  HalfToFloatNPortable(in, out, n);
}
void FloatToHalfNF16C(const float* in, uint16_t* out, int64_t n) {
  FloatToHalfNPortable(in, out, n);
}

#endif

void HalfToFloatN(const uint16_t* in, float* out, int64_t n) {
  if (HaveF16C()) {
    HalfToFloatNF16C(in, out, n);
  } else {
    HalfToFloatNPortable(in, out, n);
  }
}

void FloatToHalfN(const float* in, uint16_t* out, int64_t n) {
  if (HaveF16C()) {
    FloatToHalfNF16C(in, out, n);
  } else {
    FloatToHalfNPortable(in, out, n);
  }
}

}  // namespace cpu
}  // namespace hvdc

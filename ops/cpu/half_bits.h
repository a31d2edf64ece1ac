// float16/bfloat16 internals of ops/cpu (the public entry points are in kernels.h): bit-level
// conversions to and from float, written branch-free (selects, not branches) so that loops over
// them auto-vectorise; array conversions; the reduction and scaling paths for both types.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/types.h"
#include "ops/cpu/simd_level.h"

namespace hvdc {
namespace cpu {
namespace bits {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// c ? a : b with masks: GCC turns some ternaries into branches, which stop the vectoriser.
inline uint32_t Select(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (a & m) | (b & ~m);
}

// float16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Exact (every half is a float); a
// signalling NaN becomes quiet.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t body = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent+mantissa, float place
  const uint32_t exp = body & 0x0f800000u;
  const uint32_t normal = body + 0x38000000u;  // rebias 15 -> 127
  // Exponent 31 -> 255, payload kept; a NaN comes out quiet (as F16C's conversion does).
  const uint32_t quiet = Select((body & 0x007fe000u) != 0, 0x00400000u, 0);
  const uint32_t inf_nan = (normal + 0x38000000u) | quiet;
  // Subnormal m * 2^-24: give it exponent -14 (1.m * 2^-14) and subtract the implicit 2^-14.
  const float sub = BitsFloat(normal + 0x00800000u) - BitsFloat(0x38800000u);
  uint32_t out = Select(exp == 0x0f800000u, inf_nan, normal);
  out = Select(exp == 0, FloatBits(sub), out);
  return BitsFloat(out | sign);
}

// Round to nearest even; overflow gives inf; NaN stays NaN (quiet, top payload bits kept).
inline uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t a = static_cast<int32_t>(u & 0x7fffffffu);
  // |f| < 2^-14: adding 0.5f, whose ulp is 2^-24, rounds |f| to a multiple of 2^-24 (nearest
  // even, by the FPU); the low bits are then the subnormal (or the smallest normal) encoding.
  const uint32_t sub = FloatBits(BitsFloat(static_cast<uint32_t>(a)) + 0.5f) - 0x3f000000u;
  // Normal: rebias, add half an ulp minus one plus the kept lsb (ties to even), drop 13 bits. A
  // mantissa carry moves into the exponent, up to 0x7c00 (inf) for |f| >= 65520.
  const uint32_t odd = (static_cast<uint32_t>(a) >> 13) & 1u;
  const uint32_t normal = (static_cast<uint32_t>(a) - 0x38000000u + 0x0fffu + odd) >> 13;
  const uint32_t nan = 0x7e00u | ((static_cast<uint32_t>(a) >> 13) & 0x3ffu);
  uint32_t out = Select(a < 0x38800000, sub, normal);
  out = Select(a >= 0x47800000, 0x7c00u, out);
  out = Select(a > 0x7f800000, nan, out);
  return static_cast<uint16_t>(out | sign);
}

// bfloat16 is the top half of a float.
inline float Bfloat16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

inline uint16_t FloatToBfloat16(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // carry into inf is correct
  const uint32_t nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>(Select((u & 0x7fffffffu) > 0x7f800000u, nan, rounded));
}

}  // namespace bits

// Array conversions (in and out must not overlap). They use F16C when the CPU has it, else the
// portable loops; both give the same bits.
void HalfToFloatN(const uint16_t* in, float* out, int64_t n);
void FloatToHalfN(const float* in, uint16_t* out, int64_t n);
void Bfloat16ToFloatN(const uint16_t* in, float* out, int64_t n);
void FloatToBfloat16N(const float* in, uint16_t* out, int64_t n);
void HalfToFloatNPortable(const uint16_t* in, float* out, int64_t n);
void FloatToHalfNPortable(const float* in, uint16_t* out, int64_t n);
void HalfToFloatNF16C(const uint16_t* in, float* out, int64_t n);  // only if HaveF16C()
void FloatToHalfNF16C(const float* in, uint16_t* out, int64_t n);  // only if HaveF16C()

// float16 (bf16 false) or bfloat16 reduction and scaling through float (half_reduce.cc), at a
// dispatch level no higher than SupportedSimdLevel(): each element is widened, combined in float
// and rounded back once. For + and * that equals the correctly rounded narrow operation (float has
// at least 2p+2 bits for either type). Scaling uses the factor rounded to float. dst == src is
// allowed, partial overlap is not.
void ReduceHalfLikeAt(SimdLevel level, uint16_t* dst, const uint16_t* src, int64_t n, ReduceOp op,
                      bool bf16);
void ScaleHalfLikeAt(SimdLevel level, uint16_t* dst, const uint16_t* src, int64_t n, float factor,
                     bool bf16);

}  // namespace cpu
}  // namespace hvdc

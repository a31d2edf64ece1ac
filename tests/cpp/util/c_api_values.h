// Values for the suites that drive the runtime through its C API (core/c_api.h): the C API's
// dtypes and reduce ops by name and size, float16/bfloat16 conversions of our own (the tests do
// not trust the library's), a tolerance per dtype, and closed-form inputs and expected results
// for reductions and data movement, f(dtype, rank, index).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/c_api.h"

namespace hvdc_test {

inline const std::vector<int>& AllDtypes() {
  static const std::vector<int> kAll = {HVDC_UINT8,   HVDC_INT8,    HVDC_UINT16,  HVDC_INT16,
                                        HVDC_INT32,   HVDC_INT64,   HVDC_FLOAT16, HVDC_BFLOAT16,
                                        HVDC_FLOAT32, HVDC_FLOAT64, HVDC_BOOL};
  return kAll;
}

inline size_t DtypeSize(int dtype) {
  switch (dtype) {
    case HVDC_UINT8:
    case HVDC_INT8:
    case HVDC_BOOL:
      return 1;
    case HVDC_UINT16:
    case HVDC_INT16:
    case HVDC_FLOAT16:
    case HVDC_BFLOAT16:
      return 2;
    case HVDC_INT32:
    case HVDC_FLOAT32:
      return 4;
    case HVDC_INT64:
    case HVDC_FLOAT64:
      return 8;
  }
  return 0;
}

inline const char* DtypeName(int dtype) {
  switch (dtype) {
    case HVDC_UINT8:
      return "uint8";
    case HVDC_INT8:
      return "int8";
    case HVDC_UINT16:
      return "uint16";
    case HVDC_INT16:
      return "int16";
    case HVDC_INT32:
      return "int32";
    case HVDC_INT64:
      return "int64";
    case HVDC_FLOAT16:
      return "float16";
    case HVDC_BFLOAT16:
      return "bfloat16";
    case HVDC_FLOAT32:
      return "float32";
    case HVDC_FLOAT64:
      return "float64";
    case HVDC_BOOL:
      return "bool";
  }
  return "invalid";
}

inline const char* ReduceOpName(int op) {
  switch (op) {
    case HVDC_AVERAGE:
      return "Average";
    case HVDC_SUM:
      return "Sum";
    case HVDC_ADASUM:
      return "Adasum";
    case HVDC_MIN:
      return "Min";
    case HVDC_MAX:
      return "Max";
    case HVDC_PRODUCT:
      return "Product";
  }
  return "invalid";
}

inline bool IsFloat(int dtype) {
  return dtype == HVDC_FLOAT16 || dtype == HVDC_BFLOAT16 || dtype == HVDC_FLOAT32 ||
         dtype == HVDC_FLOAT64;
}

// Whether the dtype holds negative values.
inline bool IsSigned(int dtype) {
  return IsFloat(dtype) || dtype == HVDC_INT8 || dtype == HVDC_INT16 || dtype == HVDC_INT32 ||
         dtype == HVDC_INT64;
}

// IEEE binary16 <-> binary32, round to nearest even (subnormals included).
inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xffu) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    uint32_t out = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (out & 1u))) ++out;
    return static_cast<uint16_t>(sign | out);
  }
  uint32_t out = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (out & 1u))) ++out;
  return static_cast<uint16_t>(out);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// bfloat16 = the top half of a binary32, round to nearest even.
inline uint16_t FloatToBfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if (std::isnan(f)) return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7fc0u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float Bfloat16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Absolute tolerance for comparing a result of `dtype` with the exact value `expected`: zero for
// integer types (and for exactly representable results), a few ulps for floating point types, to
// allow for a different association order or a folded 1/size factor.
inline double Tolerance(int dtype, double expected) {
  const double mag = std::fabs(expected);
  switch (dtype) {
    case HVDC_FLOAT16:
      return 4e-3 * mag + 1e-3;
    case HVDC_BFLOAT16:
      return 2e-2 * mag + 1e-2;
    case HVDC_FLOAT32:
      return 1e-5 * mag + 1e-6;
    case HVDC_FLOAT64:
      return 1e-12 * mag + 1e-12;
  }
  return 0.0;
}

// ---------------------------------------------------------------------------------------------
// Inputs and expected values

// Rank r's element i for a reduction with `op`, chosen so that no result overflows its dtype
// (int8 and float16 included) and every result of an exact op is exactly representable.
inline double ReduceInput(int dtype, int op, int rank, int64_t i) {
  const int64_t r = rank;
  switch (op) {
    case HVDC_SUM:
      return static_cast<double>((i * 7 + r * 3) % 9 - (IsSigned(dtype) ? 4 : 0));
    case HVDC_AVERAGE: {
      // m(i) plus +k on rank 0 and -k on rank 1: the sum over any size >= 2 is size * m(i), so the
      // average is exact even for integers.
      const int64_t m = IsSigned(dtype) ? (i * 7) % 9 - 4 : 3 + (i * 7) % 9;
      const int64_t k = i % 3;
      return static_cast<double>(m + (r == 0 ? k : r == 1 ? -k : 0));
    }
    case HVDC_MIN:
    case HVDC_MAX:
      if (dtype == HVDC_BOOL) return (i + r) % 3 == 0 ? 1.0 : 0.0;
      return static_cast<double>((i * 5 + r * 7) % 13 - (IsSigned(dtype) ? 6 : 0));
    case HVDC_PRODUCT: {
      const double magnitude = static_cast<double>(1 + (i + r) % 2);
      return (IsSigned(dtype) && (i + 2 * r) % 5 == 0) ? -magnitude : magnitude;
    }
  }
  return 0.0;
}

// The reduction of Input(dtype, op, r, i) over `ranks`, then scaled.
inline double ReduceExpected(int dtype, int op, const std::vector<int>& ranks, int64_t i,
                             double prescale = 1.0, double postscale = 1.0) {
  double acc = 0.0;
  for (size_t k = 0; k < ranks.size(); ++k) {
    const double v = ReduceInput(dtype, op, ranks[k], i) * prescale;
    if (k == 0) {
      acc = v;
      continue;
    }
    switch (op) {
      case HVDC_SUM:
      case HVDC_AVERAGE:
        acc += v;
        break;
      case HVDC_MIN:
        acc = std::min(acc, v);
        break;
      case HVDC_MAX:
        acc = std::max(acc, v);
        break;
      case HVDC_PRODUCT:
        acc *= v;
        break;
    }
  }
  if (op == HVDC_AVERAGE) acc /= static_cast<double>(ranks.size());
  return acc * postscale;
}

// Rank r's element i for data-movement ops (allgather, broadcast, alltoall): distinct across ranks
// and indices within each dtype's exactly representable range.
inline double MoveValue(int dtype, int rank, int64_t i) {
  const int64_t x = static_cast<int64_t>(rank) * 31 + i * 7 + 1;
  switch (dtype) {
    case HVDC_BOOL:
      return static_cast<double>(x % 2);
    case HVDC_UINT8:
      return static_cast<double>(x % 251);
    case HVDC_INT8:
      return static_cast<double>(x % 251 - 125);
    case HVDC_UINT16:
      return static_cast<double>(x % 65521);
    case HVDC_INT16:
      return static_cast<double>(x % 65521 - 32760);
    case HVDC_INT32:
      return static_cast<double>(x % 2000003 - 1000000);
    case HVDC_INT64:  // beyond the int32 range
      return static_cast<double>((x % 2000003 - 1000000) * 4096);
    case HVDC_FLOAT16:
      return static_cast<double>(x % 2039 - 1019);
    case HVDC_BFLOAT16:
      return static_cast<double>(x % 255 - 127);
    case HVDC_FLOAT32:
      return static_cast<double>(x % 100003 - 50000) / 4.0;
    case HVDC_FLOAT64:
      return static_cast<double>(x % 1000003 - 500000) / 8.0;
  }
  return 0.0;
}

}  // namespace hvdc_test

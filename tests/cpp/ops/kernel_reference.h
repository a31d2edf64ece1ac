// The kernel tests' reference (tests/cpp/ops/): the float16/bfloat16 formats decoded and encoded
// from their IEEE layout (no bit tricks shared with the code under test), pseudo-random inputs, and
// the expected result of each element computed independently of the kernels (in double or wide
// integers, then rounded once).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/types.h"

namespace hvdc {
namespace kernel_test {

// ---- Reference formats (from the IEEE layout, no bit tricks shared with the code under test) ----

struct Format {
  int mbits;  // stored mantissa bits
  int ebits;  // exponent bits
};
constexpr Format kHalf{10, 5};
constexpr Format kBf16{7, 8};

inline double RefDecode(uint16_t v, Format f) {
  const int bias = (1 << (f.ebits - 1)) - 1;
  const int exp = (v >> f.mbits) & ((1 << f.ebits) - 1);
  const int mant = v & ((1 << f.mbits) - 1);
  const double sign = (v >> (f.mbits + f.ebits)) ? -1.0 : 1.0;
  if (exp == (1 << f.ebits) - 1) {
    return mant ? std::numeric_limits<double>::quiet_NaN()
                : sign * std::numeric_limits<double>::infinity();
  }
  if (exp == 0) return sign * std::ldexp(mant, 1 - bias - f.mbits);
  return sign * std::ldexp(mant + (1 << f.mbits), exp - bias - f.mbits);
}

// Round to nearest even (nearbyint in the default rounding mode) at the format's precision.
inline uint16_t RefEncode(double x, Format f) {
  const int bias = (1 << (f.ebits - 1)) - 1;
  const uint16_t sign = std::signbit(x) ? static_cast<uint16_t>(1u << (f.mbits + f.ebits)) : 0;
  const uint16_t exp_mask = static_cast<uint16_t>(((1 << f.ebits) - 1) << f.mbits);
  if (std::isnan(x)) return sign | exp_mask | static_cast<uint16_t>(1u << (f.mbits - 1));
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | exp_mask;
  const int emin = 1 - bias;
  int e = emin;
  if (a != 0) {
    int k;
    std::frexp(a, &k);  // a = m * 2^k, m in [0.5, 1)
    e = std::max(k - 1, emin);
  }
  double q = std::nearbyint(a / std::ldexp(1.0, e - f.mbits));
  if (q >= std::ldexp(1.0, f.mbits + 1)) {
    ++e;
    q /= 2;
  }
  if (e > bias) return sign | exp_mask;
  const int64_t qi = static_cast<int64_t>(q);
  if (qi < (int64_t{1} << f.mbits)) return sign | static_cast<uint16_t>(qi);  // subnormal or 0
  return sign | static_cast<uint16_t>(((e + bias) << f.mbits) | (qi - (int64_t{1} << f.mbits)));
}

inline bool IsNanBits(uint16_t v, Format f) {
  const int exp = (v >> f.mbits) & ((1 << f.ebits) - 1);
  return exp == (1 << f.ebits) - 1 && (v & ((1 << f.mbits) - 1)) != 0;
}

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint64_t Mix(uint64_t x) {  // splitmix64 finaliser: deterministic pseudo-random inputs
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline const DataType kAllTypes[] = {DataType::kUint8,   DataType::kInt8,    DataType::kUint16,
                                     DataType::kInt16,   DataType::kInt32,   DataType::kInt64,
                                     DataType::kFloat16, DataType::kFloat32, DataType::kFloat64,
                                     DataType::kBool,    DataType::kBfloat16};
inline const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                                   ReduceOp::kProduct, ReduceOp::kAverage};

// A typed buffer of `n` elements whose raw values are a pseudo-random function of (seed, i): full
// range for integers (so sums and products wrap), any non-NaN bits for floats (subnormals and
// infinities included), 0/1 for bool.
inline std::vector<uint8_t> MakeInput(DataType dtype, int64_t n, uint64_t seed) {
  const size_t es = DataTypeSize(dtype);
  std::vector<uint8_t> buf(static_cast<size_t>(n) * es);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t r = Mix(seed * 1000003 + static_cast<uint64_t>(i));
    if (dtype == DataType::kBool) r &= 1;
    if (dtype == DataType::kFloat16 && IsNanBits(static_cast<uint16_t>(r), kHalf)) r &= ~0x7c00ull;
    if (dtype == DataType::kBfloat16 && IsNanBits(static_cast<uint16_t>(r), kBf16)) r &= ~0x7f80ull;
    if (dtype == DataType::kFloat32 && std::isnan(FromBits(static_cast<uint32_t>(r))))
      r &= ~(1ull << 30);
    if (dtype == DataType::kFloat64) {
      double d;
      std::memcpy(&d, &r, 8);
      if (std::isnan(d)) r &= ~(1ull << 62);
    }
    std::memcpy(buf.data() + static_cast<size_t>(i) * es, &r, es);
  }
  return buf;
}

template <typename T>
inline T Load(const uint8_t* p, int64_t i) {
  T v;
  std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

// The expected element d op s, computed independently of the kernels.
template <typename T>
inline T ExpectInt(T d, T s, ReduceOp op) {
  const __int128 a = d, b = s;
  switch (op) {
    case ReduceOp::kMin:
      return s < d ? s : d;
    case ReduceOp::kMax:
      return s > d ? s : d;
    case ReduceOp::kProduct:
      return static_cast<T>(static_cast<uint64_t>(static_cast<unsigned __int128>(a * b)));
    default:
      return static_cast<T>(static_cast<uint64_t>(static_cast<unsigned __int128>(a + b)));
  }
}

inline double ExpectReal(double d, double s, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return s < d ? s : d;
    case ReduceOp::kMax:
      return s > d ? s : d;
    case ReduceOp::kProduct:
      return d * s;
    default:
      return d + s;
  }
}

// Compares element i of got against the expected result of d op s.
inline void CheckElement(DataType dtype, ReduceOp op, const uint8_t* d, const uint8_t* s,
                         const uint8_t* got, int64_t i) {
  switch (dtype) {
    case DataType::kUint8:
      ASSERT_EQ(Load<uint8_t>(got, i), ExpectInt(Load<uint8_t>(d, i), Load<uint8_t>(s, i), op));
      break;
    case DataType::kInt8:
      ASSERT_EQ(Load<int8_t>(got, i), ExpectInt(Load<int8_t>(d, i), Load<int8_t>(s, i), op));
      break;
    case DataType::kUint16:
      ASSERT_EQ(Load<uint16_t>(got, i), ExpectInt(Load<uint16_t>(d, i), Load<uint16_t>(s, i), op));
      break;
    case DataType::kInt16:
      ASSERT_EQ(Load<int16_t>(got, i), ExpectInt(Load<int16_t>(d, i), Load<int16_t>(s, i), op));
      break;
    case DataType::kInt32:
      ASSERT_EQ(Load<int32_t>(got, i), ExpectInt(Load<int32_t>(d, i), Load<int32_t>(s, i), op));
      break;
    case DataType::kInt64:
      ASSERT_EQ(Load<int64_t>(got, i), ExpectInt(Load<int64_t>(d, i), Load<int64_t>(s, i), op));
      break;
    case DataType::kBool: {
      const bool a = Load<uint8_t>(d, i) != 0, b = Load<uint8_t>(s, i) != 0;
      const bool want = (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? (a && b) : (a || b);
      ASSERT_EQ(Load<uint8_t>(got, i), want ? 1 : 0);
      break;
    }
    case DataType::kFloat32: {
      // Exact in double (or rounded once more, harmlessly: 53 >= 2*24+2), then rounded to float.
      const float want = static_cast<float>(ExpectReal(Load<float>(d, i), Load<float>(s, i), op));
      const float g = Load<float>(got, i);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(g));
      } else {
        ASSERT_EQ(Bits(g), Bits(want)) << g << " vs " << want;
      }
      break;
    }
    case DataType::kFloat64: {
      const double want = ExpectReal(Load<double>(d, i), Load<double>(s, i), op);
      const double g = Load<double>(got, i);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(g));
      } else {
        ASSERT_EQ(std::memcmp(&g, &want, 8), 0) << g << " vs " << want;
      }
      break;
    }
    case DataType::kFloat16:
    case DataType::kBfloat16: {
      const Format f = dtype == DataType::kFloat16 ? kHalf : kBf16;
      // Exact in double; one rounding to the narrow format.
      const uint16_t want = RefEncode(
          ExpectReal(RefDecode(Load<uint16_t>(d, i), f), RefDecode(Load<uint16_t>(s, i), f), op),
          f);
      const uint16_t g = Load<uint16_t>(got, i);
      if (IsNanBits(want, f)) {
        ASSERT_TRUE(IsNanBits(g, f)) << std::hex << g;
      } else {
        ASSERT_EQ(g, want) << std::hex << Load<uint16_t>(d, i) << " op " << Load<uint16_t>(s, i);
      }
      break;
    }
  }
}

template <typename T>
inline T ExpectScaleInt(T x, double factor) {
  const double t = std::trunc(static_cast<double>(x) * factor);
  if (t >= std::ldexp(1.0, std::numeric_limits<T>::digits)) return std::numeric_limits<T>::max();
  if (t < static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
  return static_cast<T>(t);
}

inline void CheckScaled(DataType dtype, double factor, const uint8_t* in, const uint8_t* got,
                        int64_t i) {
  if (factor == 1.0) {  // a plain copy, whatever the type
    const size_t es = DataTypeSize(dtype);
    ASSERT_EQ(std::memcmp(got + i * es, in + i * es, es), 0);
    return;
  }
  switch (dtype) {
    case DataType::kUint8:
      ASSERT_EQ(Load<uint8_t>(got, i), ExpectScaleInt(Load<uint8_t>(in, i), factor));
      break;
    case DataType::kInt8:
      ASSERT_EQ(Load<int8_t>(got, i), ExpectScaleInt(Load<int8_t>(in, i), factor));
      break;
    case DataType::kUint16:
      ASSERT_EQ(Load<uint16_t>(got, i), ExpectScaleInt(Load<uint16_t>(in, i), factor));
      break;
    case DataType::kInt16:
      ASSERT_EQ(Load<int16_t>(got, i), ExpectScaleInt(Load<int16_t>(in, i), factor));
      break;
    case DataType::kInt32:
      ASSERT_EQ(Load<int32_t>(got, i), ExpectScaleInt(Load<int32_t>(in, i), factor));
      break;
    case DataType::kInt64:
      ASSERT_EQ(Load<int64_t>(got, i), ExpectScaleInt(Load<int64_t>(in, i), factor));
      break;
    case DataType::kBool:
      ASSERT_EQ(Load<uint8_t>(got, i), Load<uint8_t>(in, i));
      break;
    case DataType::kFloat32: {
      const float want = static_cast<float>(static_cast<double>(Load<float>(in, i)) * factor);
      ASSERT_EQ(Bits(Load<float>(got, i)), Bits(want));
      break;
    }
    case DataType::kFloat64: {
      const double want = Load<double>(in, i) * factor, g = Load<double>(got, i);
      ASSERT_EQ(std::memcmp(&g, &want, 8), 0);
      break;
    }
    case DataType::kFloat16:
    case DataType::kBfloat16: {
      // Documented: scaled in float by the factor rounded to float. The product of the two is
      // exact in double; it is rounded to float, then to the narrow type.
      const Format f = dtype == DataType::kFloat16 ? kHalf : kBf16;
      const uint16_t x = Load<uint16_t>(in, i);
      const double product = RefDecode(x, f) * static_cast<float>(factor);
      const uint16_t want = RefEncode(static_cast<double>(static_cast<float>(product)), f);
      const uint16_t g = Load<uint16_t>(got, i);
      if (IsNanBits(want, f)) {
        ASSERT_TRUE(IsNanBits(g, f));
      } else {
        ASSERT_EQ(g, want) << std::hex << x;
      }
      break;
    }
  }
}

}  // namespace kernel_test
}  // namespace hvdc

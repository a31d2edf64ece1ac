// Reductions and scaling over host memory for the native types and bool; float16/bfloat16 are in
// half_reduce.cc. The loops (loops.h) auto-vectorise at -O2; they are compiled once per dispatch
// level (simd_level.h) and the entry points run the active one. Every operation is elementwise and
// rounds once per element (no contraction: -ffp-contract=off), so each level gives the same bits.
#include "ops/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops/cpu/half_bits.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/simd_level.h"

namespace hvdc {
namespace cpu {
namespace {

using loops::Map;
using loops::Zip;

// Integer + and * wrap around (computed unsigned, so signed overflow is not undefined).
template <typename T>
using Wide = std::conditional_t<sizeof(T) <= 4, uint32_t, uint64_t>;

template <typename T>
inline T Add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
  } else {
    return a + b;
  }
}

template <typename T>
inline T Mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
  } else {
    return a * b;
  }
}

// The op is chosen once per call, outside the loop. Min/Max keep dst unless src compares
// smaller/larger, like MPI's built-in MIN/MAX.
template <typename T, typename Body>
inline void WithOp(ReduceOp op, Body body) {
  switch (op) {
    case ReduceOp::kMin:
      body([](T d, T s) { return s < d ? s : d; });
      break;
    case ReduceOp::kMax:
      body([](T d, T s) { return s > d ? s : d; });
      break;
    case ReduceOp::kProduct:
      body([](T d, T s) { return Mul(d, s); });
      break;
    default:  // Sum and Average (the caller folds 1/size into a postscale); callers reject Adasum.
      body([](T d, T s) { return Add(d, s); });
      break;
  }
}

template <typename T>
void ReduceTyped(void* dst, const void* src, int64_t n, ReduceOp op) {
  WithOp<T>(op, [&](auto f) { Zip(static_cast<T*>(dst), static_cast<const T*>(src), n, f); });
}

void ReduceBool(void* dst, const void* src, int64_t n, ReduceOp op) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  if (op == ReduceOp::kMin || op == ReduceOp::kProduct) {
    Zip(d, s, n, [](uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) & (b != 0)); });
  } else {
    Zip(d, s, n, [](uint8_t a, uint8_t b) { return static_cast<uint8_t>((a | b) != 0); });
  }
}

// Scaled in double, truncated toward zero, saturated to T's range (NaN gives 0).
template <typename T>
inline T ScaleInt(T x, double factor) {
  const double v = static_cast<double>(x) * factor;
  if constexpr (sizeof(T) <= 4) {  // uint8 .. int32
    // Every value of T is a double: clamp with selects (vectorisable), then truncate.
    constexpr double kLo = static_cast<double>(std::numeric_limits<T>::min());
    constexpr double kHi = static_cast<double>(std::numeric_limits<T>::max());
    double c = v == v ? v : 0.0;
    c = c < kLo ? kLo : c;
    c = c > kHi ? kHi : c;
    return static_cast<T>(static_cast<int32_t>(c));  // every such T fits int32
  } else {
    const double hi = std::ldexp(1.0, std::numeric_limits<T>::digits);  // just above the range
    const double lo = std::is_signed_v<T> ? -hi : 0.0;
    const double t = std::trunc(v);
    if (!(t == t)) return 0;
    if (t >= hi) return std::numeric_limits<T>::max();
    if (t < lo) return std::numeric_limits<T>::min();
    return static_cast<T>(t);
  }
}

// True when `factor` is +-2^k with 2^k a normal float. Then float(double(x) * factor) equals
// x * float(factor) for every float x: both round the exact product (x's mantissa at another
// exponent, exactly representable in double) once to float -- subnormal, overflowing, infinite
// and NaN results alike.
bool IsFloatPowerOfTwo(double factor) {
  int e = 0;
  const double m = std::frexp(factor, &e);
  return (m == 0.5 || m == -0.5) && e - 1 >= -126 && e - 1 <= 127;
}

template <typename T>
void ScaleTyped(void* dst, const void* src, int64_t n, double factor) {
  auto* d = static_cast<T*>(dst);
  const auto* s = static_cast<const T*>(src);
  if constexpr (std::is_integral_v<T>) {
    Map(d, s, n, [factor](T x) { return ScaleInt(x, factor); });
  } else if (std::is_same_v<T, float> && IsFloatPowerOfTwo(factor)) {
    // Average over 2, 4, 8... ranks: the same bits in float, at the speed of a copy (the double
    // path converts every element twice).
    const T f = static_cast<T>(factor);
    Map(d, s, n, [f](T x) { return x * f; });
  } else {
    // float32 too is multiplied in double, then rounded to float.
    Map(d, s, n, [factor](T x) { return static_cast<T>(static_cast<double>(x) * factor); });
  }
}

// Every dtype at one level: inlined into the per-level functions below (flatten), so compiled for
// each level's target; float16/bfloat16 call their own per-level code in half_reduce.cc.
inline void ReduceAll(SimdLevel level, void* dst, const void* src, int64_t count, DataType dtype,
                      ReduceOp op) {
  switch (dtype) {
    case DataType::kUint8:
      return ReduceTyped<uint8_t>(dst, src, count, op);
    case DataType::kInt8:
      return ReduceTyped<int8_t>(dst, src, count, op);
    case DataType::kUint16:
      return ReduceTyped<uint16_t>(dst, src, count, op);
    case DataType::kInt16:
      return ReduceTyped<int16_t>(dst, src, count, op);
    case DataType::kInt32:
      return ReduceTyped<int32_t>(dst, src, count, op);
    case DataType::kInt64:
      return ReduceTyped<int64_t>(dst, src, count, op);
    case DataType::kFloat32:
      return ReduceTyped<float>(dst, src, count, op);
    case DataType::kFloat64:
      return ReduceTyped<double>(dst, src, count, op);
    case DataType::kBool:
      return ReduceBool(dst, src, count, op);
    case DataType::kFloat16:
      return ReduceHalfLikeAt(level, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                              count, op, /*bf16=*/false);
    case DataType::kBfloat16:
      return ReduceHalfLikeAt(level, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                              count, op, /*bf16=*/true);
  }
}

inline void ScaleAll(SimdLevel level, void* dst, const void* src, int64_t count, DataType dtype,
                     double factor) {
  switch (dtype) {
    case DataType::kUint8:
      return ScaleTyped<uint8_t>(dst, src, count, factor);
    case DataType::kInt8:
      return ScaleTyped<int8_t>(dst, src, count, factor);
    case DataType::kUint16:
      return ScaleTyped<uint16_t>(dst, src, count, factor);
    case DataType::kInt16:
      return ScaleTyped<int16_t>(dst, src, count, factor);
    case DataType::kInt32:
      return ScaleTyped<int32_t>(dst, src, count, factor);
    case DataType::kInt64:
      return ScaleTyped<int64_t>(dst, src, count, factor);
    case DataType::kFloat32:
      return ScaleTyped<float>(dst, src, count, factor);
    case DataType::kFloat64:
      return ScaleTyped<double>(dst, src, count, factor);
    case DataType::kFloat16:
      return ScaleHalfLikeAt(level, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                             count, static_cast<float>(factor), /*bf16=*/false);
    case DataType::kBfloat16:
      return ScaleHalfLikeAt(level, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                             count, static_cast<float>(factor), /*bf16=*/true);
    case DataType::kBool:  // copied by ScaleCopyAt
      return;
  }
}

__attribute__((flatten)) void ReduceBaseline(void* dst, const void* src, int64_t count,
                                             DataType dtype, ReduceOp op) {
  ReduceAll(SimdLevel::kBaseline, dst, src, count, dtype, op);
}

__attribute__((flatten)) void ScaleBaseline(void* dst, const void* src, int64_t count,
                                            DataType dtype, double factor) {
  ScaleAll(SimdLevel::kBaseline, dst, src, count, dtype, factor);
}

#ifdef HVDC_HAVE_X86

HVDC_TARGET_AVX2 __attribute__((flatten)) void ReduceAvx2(void* dst, const void* src, int64_t count,
                                                          DataType dtype, ReduceOp op) {
  ReduceAll(SimdLevel::kAvx2, dst, src, count, dtype, op);
}

HVDC_TARGET_AVX2 __attribute__((flatten)) void ScaleAvx2(void* dst, const void* src, int64_t count,
                                                         DataType dtype, double factor) {
  ScaleAll(SimdLevel::kAvx2, dst, src, count, dtype, factor);
}

HVDC_TARGET_AVX512 __attribute__((flatten)) void ReduceAvx512(void* dst, const void* src,
                                                              int64_t count, DataType dtype,
                                                              ReduceOp op) {
  ReduceAll(SimdLevel::kAvx512, dst, src, count, dtype, op);
}

HVDC_TARGET_AVX512 __attribute__((flatten)) void ScaleAvx512(void* dst, const void* src,
                                                             int64_t count, DataType dtype,
                                                             double factor) {
  ScaleAll(SimdLevel::kAvx512, dst, src, count, dtype, factor);
}

#endif  // HVDC_HAVE_X86

}  // namespace

void ReduceIntoAt(SimdLevel level, void* dst, const void* src, int64_t count, DataType dtype,
                  ReduceOp op) {
  if (count <= 0) return;
  switch (std::min(level, SupportedSimdLevel())) {
#ifdef HVDC_HAVE_X86
    case SimdLevel::kAvx512:
      return ReduceAvx512(dst, src, count, dtype, op);
    case SimdLevel::kAvx2:
      return ReduceAvx2(dst, src, count, dtype, op);
#endif
    default:
      return ReduceBaseline(dst, src, count, dtype, op);
  }
}

void ScaleCopyAt(SimdLevel level, void* dst, const void* src, int64_t count, DataType dtype,
                 double factor) {
  if (count <= 0) return;
  if (factor == 1.0 || dtype == DataType::kBool) {
    if (dst != src) std::memmove(dst, src, static_cast<size_t>(count) * DataTypeSize(dtype));
    return;
  }
  switch (std::min(level, SupportedSimdLevel())) {
#ifdef HVDC_HAVE_X86
    case SimdLevel::kAvx512:
      return ScaleAvx512(dst, src, count, dtype, factor);
    case SimdLevel::kAvx2:
      return ScaleAvx2(dst, src, count, dtype, factor);
#endif
    default:
      return ScaleBaseline(dst, src, count, dtype, factor);
  }
}

void ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op) {
  ReduceIntoAt(ActiveSimdLevel(), dst, src, count, dtype, op);
}

void ScaleCopy(void* dst, const void* src, int64_t count, DataType dtype, double factor) {
  ScaleCopyAt(ActiveSimdLevel(), dst, src, count, dtype, factor);
}

}  // namespace cpu
}  // namespace hvdc

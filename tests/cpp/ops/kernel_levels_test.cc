// ops/cpu kernels at every dispatch level (ops/cpu/simd_level.h) this CPU runs; the others are
// skipped, by name. Each level is checked against the independent reference (kernel_reference.h)
// and bit for bit against the baseline level: every dtype x op x size around the vector widths,
// from pointers off the vector alignment, in and out of place; NaN, infinity, signed zero and
// subnormal operands; integer wrap-around; every float16 and bfloat16 value.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/types.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/simd_level.h"
#include "tests/cpp/ops/kernel_reference.h"

namespace hvdc {
namespace {

using namespace kernel_test;  // NOLINT: the reference is this test's vocabulary
using cpu::SimdLevel;

// Around an AVX-512 register (16 floats, 64 bytes) and the loops' blocks of 64 elements.
const int64_t kSizes[] = {0, 1, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 1000, 4099};
// (dst, src) offsets in elements from a 64-byte boundary: aligned, both off, off differently.
const std::pair<int, int> kOffsets[] = {{0, 0}, {1, 1}, {1, 3}, {3, 0}};

// Bytes whose `data` starts `offset` bytes past a 64-byte boundary; the rest is `fill`.
struct Buffer {
  Buffer(size_t bytes, size_t offset, uint8_t fill) : storage(bytes + offset + 64, fill) {
    const auto base = reinterpret_cast<uintptr_t>(storage.data());
    data = storage.data() + (64 - base % 64) % 64 + offset;
  }
  Buffer(const Buffer&) = delete;
  void CopyIn(const std::vector<uint8_t>& v) {  // memcpy must not get an empty vector's null
    if (!v.empty()) std::memcpy(data, v.data(), v.size());
  }
  Buffer& operator=(const Buffer&) = delete;
  std::vector<uint8_t> storage;
  uint8_t* data;
};

class AtLevel : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (level() > cpu::SupportedSimdLevel()) {
      GTEST_SKIP() << "this CPU does not run " << cpu::SimdLevelName(level())
                   << " (its widest level: " << cpu::SimdLevelName(cpu::SupportedSimdLevel())
                   << ")";
    }
  }
  SimdLevel level() const { return GetParam(); }
};

TEST(SimdLevel, DetectionAgreesWithTheCompilerAndCapsApply) {
  const SimdLevel supported = cpu::SupportedSimdLevel();
  std::cout << "widest level this CPU runs: " << cpu::SimdLevelName(supported) << "\n";
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  EXPECT_EQ(supported >= SimdLevel::kAvx2, avx2);
  EXPECT_EQ(supported >= SimdLevel::kAvx512, avx512);
#endif
  EXPECT_EQ(cpu::ActiveSimdLevel(), supported);  // the widest unless capped
  EXPECT_EQ(cpu::CapSimdLevel(SimdLevel::kBaseline), SimdLevel::kBaseline);
  EXPECT_EQ(cpu::ActiveSimdLevel(), SimdLevel::kBaseline);
  EXPECT_EQ(cpu::CapSimdLevel(SimdLevel::kAvx512), supported);  // never above the CPU
  EXPECT_EQ(cpu::ActiveSimdLevel(), supported);
}

TEST_P(AtLevel, ReduceMatchesTheReferenceAndTheBaselineBitForBit) {
  for (DataType dtype : kAllTypes) {
    const size_t es = DataTypeSize(dtype);
    for (ReduceOp op : kAllOps) {
      for (int64_t n : kSizes) {
        const std::vector<uint8_t> d0 = MakeInput(dtype, n, 1 + static_cast<uint64_t>(dtype));
        const std::vector<uint8_t> s0 = MakeInput(dtype, n, 100 + static_cast<uint64_t>(dtype));
        const size_t bytes = d0.size();
        for (auto [od, os] : kOffsets) {
          SCOPED_TRACE(std::string(DataTypeName(dtype)) + " " + ReduceOpName(op) +
                       " n=" + std::to_string(n) + " offsets " + std::to_string(od) + "," +
                       std::to_string(os));
          Buffer d(bytes + es, od * es, 0xa5), s(bytes, os * es, 0), base(bytes, 0, 0);
          d.CopyIn(d0);
          s.CopyIn(s0);
          base.CopyIn(d0);
          cpu::ReduceIntoAt(level(), d.data, s.data, n, dtype, op);
          cpu::ReduceIntoAt(SimdLevel::kBaseline, base.data, s.data, n, dtype, op);
          ASSERT_EQ(std::memcmp(d.data, base.data, bytes), 0) << "differs from the baseline";
          for (size_t b = 0; b < es; ++b)
            ASSERT_EQ(d.data[bytes + b], 0xa5) << "wrote past the end";
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_NO_FATAL_FAILURE(CheckElement(dtype, op, d0.data(), s0.data(), d.data, i))
                << "element " << i;
          }
          // dst == src: x op x.
          Buffer x(bytes, od * es, 0);
          x.CopyIn(d0);
          cpu::ReduceIntoAt(level(), x.data, x.data, n, dtype, op);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_NO_FATAL_FAILURE(CheckElement(dtype, op, d0.data(), d0.data(), x.data, i))
                << "in place, element " << i;
          }
        }
      }
    }
  }
}

TEST_P(AtLevel, ScaleMatchesTheReferenceAndTheBaselineBitForBit) {
  for (DataType dtype : kAllTypes) {
    const size_t es = DataTypeSize(dtype);
    for (double factor : {0.5, -3.0, 1.0 / 3.0, 0.0, 1e30, 1.0}) {
      for (int64_t n : kSizes) {
        const std::vector<uint8_t> in = MakeInput(dtype, n, 7 + static_cast<uint64_t>(dtype));
        const size_t bytes = in.size();
        for (auto [od, os] : kOffsets) {
          SCOPED_TRACE(std::string(DataTypeName(dtype)) + " factor " + std::to_string(factor) +
                       " n=" + std::to_string(n) + " offsets " + std::to_string(od) + "," +
                       std::to_string(os));
          Buffer out(bytes + es, od * es, 0xa5), src(bytes, os * es, 0), base(bytes, 0, 0);
          Buffer inplace(bytes, od * es, 0);
          src.CopyIn(in);
          inplace.CopyIn(in);
          cpu::ScaleCopyAt(level(), out.data, src.data, n, dtype, factor);
          cpu::ScaleCopyAt(level(), inplace.data, inplace.data, n, dtype, factor);
          cpu::ScaleCopyAt(SimdLevel::kBaseline, base.data, src.data, n, dtype, factor);
          ASSERT_EQ(std::memcmp(out.data, base.data, bytes), 0) << "differs from the baseline";
          ASSERT_EQ(std::memcmp(inplace.data, base.data, bytes), 0) << "in place differs";
          for (size_t b = 0; b < es; ++b) ASSERT_EQ(out.data[bytes + b], 0xa5);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_NO_FATAL_FAILURE(CheckScaled(dtype, factor, in.data(), out.data, i))
                << "element " << i;
          }
        }
      }
    }
  }
}

// ---- Special floating-point operands ----

// The float types as raw bits: NaN tests need the bits, which a double cannot carry.
struct FloatType {
  DataType dtype;
  uint64_t quiet_bit;
  std::vector<uint64_t> specials;  // zeros, subnormals, the normal edges, infinities, NaNs
};

std::vector<FloatType> FloatTypes() {
  return {
      {DataType::kFloat32,
       1ull << 22,
       {0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00800000, 0x00c00000, 0x3f000000,
        0x3f400000, 0xbfc00000, 0x3f800000, 0x34000000, 0x4b800000, 0x7f7fffff, 0xff7fffff,
        0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001, 0x7fa00000}},
      {DataType::kFloat64,
       1ull << 51,
       {0x0000000000000000, 0x8000000000000000, 0x0000000000000001, 0x800fffffffffffff,
        0x0010000000000000, 0x0018000000000000, 0x3fe0000000000000, 0x3fe8000000000000,
        0xbff8000000000000, 0x3ff0000000000000, 0x3cb0000000000000, 0x4340000000000000,
        0x7fefffffffffffff, 0xffefffffffffffff, 0x7ff0000000000000, 0xfff0000000000000,
        0x7ff8000000000000, 0xfff8000000000001, 0x7ff0000000000001, 0x7ff4000000000000}},
      {DataType::kFloat16, 1ull << 9, {0x0000, 0x8000, 0x0001, 0x83ff, 0x0400, 0x0600, 0x3800,
                                       0x3a00, 0xbe00, 0x3c00, 0x1400, 0x6400, 0x7bff, 0xfbff,
                                       0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01, 0x7d00}},
      {DataType::kBfloat16, 1ull << 6, {0x0000, 0x8000, 0x0001, 0x807f, 0x0080, 0x00c0, 0x3f00,
                                        0x3f40, 0xbfc0, 0x3f80, 0x3c00, 0x4b80, 0x7f7f, 0xff7f,
                                        0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x7fa0}},
  };
}

uint64_t GetBits(const uint8_t* p, int64_t i, size_t es) {
  uint64_t v = 0;
  std::memcpy(&v, p + static_cast<size_t>(i) * es, es);
  return v;
}

void PutBits(uint8_t* p, int64_t i, size_t es, uint64_t v) {
  std::memcpy(p + static_cast<size_t>(i) * es, &v, es);
}

bool IsNan(DataType dtype, uint64_t v) {
  switch (dtype) {
    case DataType::kFloat32:
      return (v & 0x7fffffffu) > 0x7f800000u;
    case DataType::kFloat64:
      return (v & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case DataType::kFloat16:
      return IsNanBits(static_cast<uint16_t>(v), kHalf);
    default:
      return IsNanBits(static_cast<uint16_t>(v), kBf16);
  }
}

// The defined NaN behaviour, on every level alike:
//  - Sum/Average/Product with one NaN operand: that NaN, made quiet (its payload kept);
//  - with two: a quiet NaN, the payload of either (x86 keeps the first operand's, and which one
//    comes first is the compiler's choice, so this alone is not bitwise across levels);
//  - Min/Max: dst whenever either is NaN (src replaces dst only when it compares smaller/larger),
//    as is for float32/float64; float16/bfloat16 make it quiet (they go through float);
//  - a NaN from numbers (inf - inf, 0 * inf): the same bits as the baseline.
// Every other result must equal the baseline's bits and the reference.
void CheckSpecial(const FloatType& t, ReduceOp op, uint64_t d, uint64_t s, uint64_t got,
                  uint64_t base) {
  const bool narrow = t.dtype == DataType::kFloat16 || t.dtype == DataType::kBfloat16;
  const bool minmax = op == ReduceOp::kMin || op == ReduceOp::kMax;
  const bool dnan = IsNan(t.dtype, d), snan = IsNan(t.dtype, s);
  const uint64_t qd = d | t.quiet_bit, qs = s | t.quiet_bit;
  if (minmax && dnan) {
    ASSERT_EQ(got, narrow ? qd : d);
  } else if (!minmax && dnan && snan) {
    ASSERT_TRUE(got == qd || got == qs) << "neither operand's quiet NaN";
    return;
  } else if (!minmax && (dnan || snan)) {
    ASSERT_EQ(got, dnan ? qd : qs);
  }
  ASSERT_EQ(got, base) << "differs from the baseline";
}

TEST_P(AtLevel, SpecialOperandsEveryPair) {
  for (const FloatType& t : FloatTypes()) {
    const size_t es = DataTypeSize(t.dtype);
    const int64_t p = static_cast<int64_t>(t.specials.size());
    const int64_t n = p * p;  // every (dst, src) pair, mostly in the vector loop
    std::vector<uint8_t> d0(static_cast<size_t>(n) * es), s0(d0.size());
    for (int64_t i = 0; i < n; ++i) {
      PutBits(d0.data(), i, es, t.specials[static_cast<size_t>(i / p)]);
      PutBits(s0.data(), i, es, t.specials[static_cast<size_t>(i % p)]);
    }
    for (ReduceOp op : kAllOps) {
      SCOPED_TRACE(std::string(DataTypeName(t.dtype)) + " " + ReduceOpName(op));
      std::vector<uint8_t> got = d0, base = d0, single = d0;
      cpu::ReduceIntoAt(level(), got.data(), s0.data(), n, t.dtype, op);
      cpu::ReduceIntoAt(SimdLevel::kBaseline, base.data(), s0.data(), n, t.dtype, op);
      for (int64_t i = 0; i < n; ++i) {  // one element per call: the scalar tails
        cpu::ReduceIntoAt(level(), single.data() + i * es, s0.data() + i * es, 1, t.dtype, op);
      }
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t d = GetBits(d0.data(), i, es), s = GetBits(s0.data(), i, es);
        const uint64_t b = GetBits(base.data(), i, es);
        ASSERT_NO_FATAL_FAILURE(CheckSpecial(t, op, d, s, GetBits(got.data(), i, es), b))
            << std::hex << "dst " << d << " src " << s;
        ASSERT_NO_FATAL_FAILURE(CheckSpecial(t, op, d, s, GetBits(single.data(), i, es), b))
            << std::hex << "one element, dst " << d << " src " << s;
        if (!IsNan(t.dtype, d) && !IsNan(t.dtype, s)) {
          ASSERT_NO_FATAL_FAILURE(CheckElement(t.dtype, op, d0.data(), s0.data(), got.data(), i))
              << std::hex << "dst " << d << " src " << s;
        }
      }
    }
  }
}

// Every float16 and bfloat16 value against another (a fixed permutation), and scaled.
TEST_P(AtLevel, EveryHalfAndBfloat16Value) {
  const int64_t n = 0x10000;
  for (const FloatType& t : FloatTypes()) {
    if (DataTypeSize(t.dtype) != 2) continue;
    std::vector<uint16_t> d0(n), s0(n);
    for (int64_t i = 0; i < n; ++i) {
      d0[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
      s0[static_cast<size_t>(i)] = static_cast<uint16_t>(i * 40503 + 12345);  // odd: a bijection
    }
    for (ReduceOp op : kAllOps) {
      SCOPED_TRACE(std::string(DataTypeName(t.dtype)) + " " + ReduceOpName(op));
      std::vector<uint16_t> got = d0, base = d0;
      cpu::ReduceIntoAt(level(), got.data(), s0.data(), n, t.dtype, op);
      cpu::ReduceIntoAt(SimdLevel::kBaseline, base.data(), s0.data(), n, t.dtype, op);
      for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
        ASSERT_NO_FATAL_FAILURE(CheckSpecial(t, op, d0[i], s0[i], got[i], base[i]))
            << std::hex << "dst " << d0[i] << " src " << s0[i];
        if (!IsNan(t.dtype, d0[i]) && !IsNan(t.dtype, s0[i])) {
          ASSERT_NO_FATAL_FAILURE(
              CheckElement(t.dtype, op, reinterpret_cast<const uint8_t*>(d0.data()),
                           reinterpret_cast<const uint8_t*>(s0.data()),
                           reinterpret_cast<const uint8_t*>(got.data()), static_cast<int64_t>(i)));
        }
      }
    }
    for (double factor : {1.0 / 3.0, -7.0, 0.5, 1e-3, 65504.0}) {
      SCOPED_TRACE(std::string(DataTypeName(t.dtype)) + " factor " + std::to_string(factor));
      std::vector<uint16_t> got(n), base(n);
      cpu::ScaleCopyAt(level(), got.data(), d0.data(), n, t.dtype, factor);
      cpu::ScaleCopyAt(SimdLevel::kBaseline, base.data(), d0.data(), n, t.dtype, factor);
      ASSERT_EQ(got, base);  // one operand: NaN included, bit for bit
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NO_FATAL_FAILURE(CheckScaled(t.dtype, factor,
                                            reinterpret_cast<const uint8_t*>(d0.data()),
                                            reinterpret_cast<const uint8_t*>(got.data()), i));
      }
    }
  }
}

// ---- Integers wrap around ----

// 70 copies of one (dst, src) pair: the vector loop and the scalar tail.
template <typename T>
void CheckWrap(SimdLevel level, DataType dtype, ReduceOp op, T d, T s, T want) {
  SCOPED_TRACE(std::string(DataTypeName(dtype)) + " " + ReduceOpName(op) + " " + std::to_string(d) +
               ", " + std::to_string(s));
  std::vector<T> dst(70, d), src(70, s);
  cpu::ReduceIntoAt(level, dst.data(), src.data(), 70, dtype, op);
  for (T v : dst) ASSERT_EQ(v, want);
}

TEST_P(AtLevel, IntegerSumAndProductWrapAround) {
  using L8 = std::numeric_limits<int8_t>;
  using L16 = std::numeric_limits<int16_t>;
  using L32 = std::numeric_limits<int32_t>;
  using L64 = std::numeric_limits<int64_t>;
  const ReduceOp kSum = ReduceOp::kSum, kProd = ReduceOp::kProduct;
  CheckWrap<uint8_t>(level(), DataType::kUint8, kSum, 255, 1, 0);
  CheckWrap<uint8_t>(level(), DataType::kUint8, kProd, 16, 17, 16);  // 272 - 256
  CheckWrap<int8_t>(level(), DataType::kInt8, kSum, L8::max(), 1, L8::min());
  CheckWrap<int8_t>(level(), DataType::kInt8, kProd, -128, -1, -128);
  CheckWrap<uint16_t>(level(), DataType::kUint16, kSum, 65535, 2, 1);
  CheckWrap<int16_t>(level(), DataType::kInt16, kSum, L16::max(), 1, L16::min());
  CheckWrap<int16_t>(level(), DataType::kInt16, kProd, 300, 300, 24464);  // 90000 - 65536
  CheckWrap<int32_t>(level(), DataType::kInt32, kSum, L32::max(), 1, L32::min());
  CheckWrap<int32_t>(level(), DataType::kInt32, kProd, 65536, 65536, 0);
  CheckWrap<int32_t>(level(), DataType::kInt32, kProd, L32::min(), -1, L32::min());
  CheckWrap<int64_t>(level(), DataType::kInt64, kSum, L64::max(), 1, L64::min());
  CheckWrap<int64_t>(level(), DataType::kInt64, kSum, L64::min(), -1, L64::max());
  CheckWrap<int64_t>(level(), DataType::kInt64, kProd, L64::min(), -1, L64::min());
  CheckWrap<int64_t>(level(), DataType::kInt64, kProd, int64_t{1} << 32, int64_t{1} << 32, 0);
}

INSTANTIATE_TEST_SUITE_P(Levels, AtLevel, ::testing::ValuesIn(cpu::kAllSimdLevels),
                         [](const ::testing::TestParamInfo<SimdLevel>& info) {
                           return std::string(cpu::SimdLevelName(info.param));
                         });

}  // namespace
}  // namespace hvdc

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

// ops/cpu kernels at the active level: every dtype x op x size against values computed here
// independently (kernel_reference.h), and the float16/bfloat16 conversions bit by bit, on every
// conversion path the CPU offers. kernel_levels_test.cc runs every dispatch level.
#include "ops/cpu/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/types.h"
#include "ops/cpu/half_bits.h"
#include "ops/cpu/simd_level.h"
#include "tests/cpp/ops/kernel_reference.h"

namespace hvdc {
namespace {

using namespace kernel_test;  // NOLINT: the reference is this test's vocabulary

// Floats that stress rounding: every half's neighbourhood (value, midpoints and one float ulp
// either side), pseudo-random bit patterns, and specials.
std::vector<float> InterestingFloats() {
  std::vector<float> out;
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float lo = static_cast<float>(RefDecode(static_cast<uint16_t>(h), kHalf));
    const float hi = static_cast<float>(RefDecode(static_cast<uint16_t>(h + 1), kHalf));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact in float
    for (float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      out.push_back(v);
      out.push_back(-v);
    }
  }
  for (uint64_t i = 0; i < 300000; ++i) out.push_back(FromBits(static_cast<uint32_t>(Mix(i))));
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, 65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e10f, inf, 1e-45f, 1e-38f,
                  5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f, 3.4028235e38f}) {
    out.push_back(v);
    out.push_back(-v);
  }
  for (uint32_t b : {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fbfffffu, 0x7fffffffu, 0xff800123u})
    out.push_back(FromBits(b));
  return out;
}

// ---- Conversions ----

TEST(HalfConversion, KnownValues) {
  EXPECT_EQ(cpu::FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(cpu::FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(cpu::FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(cpu::FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(cpu::FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(cpu::FloatToHalf(65520.0f), 0x7c00);  // tie with the next binade: to even (inf)
  EXPECT_EQ(cpu::FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(cpu::FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);         // tie to even 0
  EXPECT_EQ(cpu::FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);         // tie to even 2
  EXPECT_EQ(cpu::FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);         // smallest normal
  EXPECT_EQ(cpu::FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie: down to even
  EXPECT_EQ(cpu::FloatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie: up to even
  EXPECT_EQ(cpu::FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(IsNanBits(cpu::FloatToHalf(std::nanf("")), kHalf));
  EXPECT_EQ(cpu::HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(cpu::HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(cpu::HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(cpu::HalfToFloat(0x7e00)));
  EXPECT_EQ(cpu::FloatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(cpu::FloatToBfloat16(FromBits(0x3f808000u)), 0x3f80);  // tie: down to even
  EXPECT_EQ(cpu::FloatToBfloat16(FromBits(0x3f818000u)), 0x3f82);  // tie: up to even
  EXPECT_EQ(cpu::FloatToBfloat16(FromBits(0x7f7fffffu)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(cpu::FloatToBfloat16(FromBits(0x00000001u)), 0x0000);  // float subnormal, tiny
  EXPECT_EQ(cpu::FloatToBfloat16(FromBits(0x00008000u)), 0x0000);  // tie to even 0
  EXPECT_EQ(cpu::FloatToBfloat16(FromBits(0x00018000u)), 0x0002);  // tie to even 2
  EXPECT_TRUE(IsNanBits(cpu::FloatToBfloat16(FromBits(0x7f800001u)), kBf16));  // payload low
  EXPECT_EQ(cpu::Bfloat16ToFloat(0x0001), std::ldexp(1.0f, -133));
}

void CheckDecodeAll(Format f, float (*decode)(uint16_t), uint16_t (*encode)(float)) {
  for (uint32_t v = 0; v <= 0xffff; ++v) {
    const uint16_t h = static_cast<uint16_t>(v);
    const float got = decode(h);
    const double want = RefDecode(h, f);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << v;
      ASSERT_EQ(Bits(got) >> 31, v >> (f.mbits + f.ebits)) << std::hex << v;  // sign kept
      if (f.mbits == 10) {  // float16 widens to a quiet NaN with the payload kept (as F16C)
        ASSERT_EQ(Bits(got), ((v & 0x8000u) << 16) | 0x7fc00000u | ((v & 0x3ffu) << 13)) << v;
      }
      // A NaN comes back quiet, sign and top payload bits kept.
      ASSERT_EQ(encode(got), h | (1u << (f.mbits - 1))) << std::hex << v;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << v;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << v;
      ASSERT_EQ(encode(got), h) << std::hex << v;  // round trip
    }
  }
}

TEST(HalfConversion, EveryHalfDecodesAndRoundTrips) {
  CheckDecodeAll(kHalf, cpu::HalfToFloat, cpu::FloatToHalf);
}

TEST(HalfConversion, EveryBfloat16DecodesAndRoundTrips) {
  CheckDecodeAll(kBf16, cpu::Bfloat16ToFloat, cpu::FloatToBfloat16);
}

void CheckEncode(Format f, uint16_t (*encode)(float), const std::vector<float>& in) {
  for (float x : in) {
    const uint16_t got = encode(x);
    const uint16_t want = RefEncode(static_cast<double>(x), f);
    if (std::isnan(x)) {
      ASSERT_TRUE(IsNanBits(got, f)) << std::hex << Bits(x);
      ASSERT_EQ(got >> (f.mbits + f.ebits), Bits(x) >> 31) << std::hex << Bits(x);
    } else {
      ASSERT_EQ(got, want) << std::hex << "float bits " << Bits(x) << " = " << x;
    }
  }
}

TEST(HalfConversion, FloatToHalfRoundsToNearestEven) {
  CheckEncode(kHalf, cpu::FloatToHalf, InterestingFloats());
}

TEST(HalfConversion, FloatToBfloat16RoundsToNearestEven) {
  std::vector<float> in = InterestingFloats();
  for (uint32_t b = 0; b < 0x10000; ++b) {  // every bf16 value, its ties and their neighbours
    for (uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u}) in.push_back(FromBits(b << 16 | low));
  }
  CheckEncode(kBf16, cpu::FloatToBfloat16, in);
}

// The array paths (F16C when present, portable otherwise) agree bit for bit with the scalar ones.
TEST(HalfConversion, ArrayPathsMatchScalar) {
  std::vector<uint16_t> all(0x10000 + 5);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> widened(all.size());
  std::vector<float> floats = InterestingFloats();
  std::vector<uint16_t> narrowed(floats.size());

  using Widen = void (*)(const uint16_t*, float*, int64_t);
  using Narrow = void (*)(const float*, uint16_t*, int64_t);
  struct Path {
    const char* name;
    Widen widen;
    Narrow narrow;
    float (*scalar_widen)(uint16_t);
    uint16_t (*scalar_narrow)(float);
  };
  std::vector<Path> paths = {
      {"half auto", cpu::HalfToFloatN, cpu::FloatToHalfN, cpu::HalfToFloat, cpu::FloatToHalf},
      {"half portable", cpu::HalfToFloatNPortable, cpu::FloatToHalfNPortable, cpu::HalfToFloat,
       cpu::FloatToHalf},
      {"bf16", cpu::Bfloat16ToFloatN, cpu::FloatToBfloat16N, cpu::Bfloat16ToFloat,
       cpu::FloatToBfloat16},
  };
  if (cpu::HaveF16C()) {
    paths.push_back({"half f16c", cpu::HalfToFloatNF16C, cpu::FloatToHalfNF16C, cpu::HalfToFloat,
                     cpu::FloatToHalf});
  }
  for (const Path& p : paths) {
    SCOPED_TRACE(p.name);
    p.widen(all.data(), widened.data(), static_cast<int64_t>(all.size()));
    for (size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(Bits(widened[i]), Bits(p.scalar_widen(all[i]))) << i;
    }
    p.narrow(floats.data(), narrowed.data(), static_cast<int64_t>(floats.size()));
    for (size_t i = 0; i < floats.size(); ++i) {
      ASSERT_EQ(narrowed[i], p.scalar_narrow(floats[i])) << std::hex << Bits(floats[i]);
    }
  }
}

// ---- Reductions ----

const int64_t kSizes[] = {0, 1, 7, 63, 64, 65, 1000, 4099};

using ReduceFn = void (*)(void*, const void*, int64_t, DataType, ReduceOp);

void CheckReduce(ReduceFn reduce, DataType dtype, ReduceOp op, int64_t n) {
  SCOPED_TRACE(std::string(DataTypeName(dtype)) + " " + ReduceOpName(op) +
               " n=" + std::to_string(n));
  const std::vector<uint8_t> d0 = MakeInput(dtype, n, 1 + static_cast<uint64_t>(dtype));
  const std::vector<uint8_t> s = MakeInput(dtype, n, 100 + static_cast<uint64_t>(dtype));
  // Out of place, with a guard element after the end that must stay untouched.
  const size_t es = DataTypeSize(dtype);
  std::vector<uint8_t> d = d0;
  d.resize(d0.size() + es, 0xa5);
  reduce(d.data(), s.data(), n, dtype, op);
  for (int64_t i = 0; i < n; ++i) {
    CheckElement(dtype, op, d0.data(), s.data(), d.data(), i);
    if (::testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "at element " << i;
      return;
    }
  }
  for (size_t b = 0; b < es; ++b) ASSERT_EQ(d[d0.size() + b], 0xa5) << "wrote past the end";
  // dst == src: x op x.
  std::vector<uint8_t> same = d0;
  reduce(same.data(), same.data(), n, dtype, op);
  for (int64_t i = 0; i < n; ++i) {
    CheckElement(dtype, op, d0.data(), d0.data(), same.data(), i);
    if (::testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "in place, at element " << i;
      return;
    }
  }
}

TEST(ReduceInto, EveryTypeOpAndSize) {
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      for (int64_t n : kSizes) {
        CheckReduce(cpu::ReduceInto, dtype, op, n);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(ReduceInto, NanPropagatesThroughSum) {
  float d[3] = {1.0f, std::nanf(""), 2.0f};
  const float s[3] = {std::nanf(""), 1.0f, 3.0f};
  cpu::ReduceInto(d, s, 3, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_TRUE(std::isnan(d[0]));
  EXPECT_TRUE(std::isnan(d[1]));
  EXPECT_EQ(d[2], 5.0f);
  uint16_t h[2] = {0x7e00, 0x3c00};
  const uint16_t hs[2] = {0x3c00, 0xfe00};
  cpu::ReduceInto(h, hs, 2, DataType::kFloat16, ReduceOp::kSum);
  EXPECT_TRUE(IsNanBits(h[0], kHalf));
  EXPECT_TRUE(IsNanBits(h[1], kHalf));
}

TEST(ReduceInto, BoolTreatsAnyNonZeroAsTrue) {
  uint8_t d[4] = {0, 2, 0, 7};
  const uint8_t s[4] = {0, 0, 5, 9};
  uint8_t e[4];
  std::memcpy(e, d, 4);
  cpu::ReduceInto(d, s, 4, DataType::kBool, ReduceOp::kSum);
  EXPECT_EQ(std::vector<uint8_t>(d, d + 4), (std::vector<uint8_t>{0, 1, 1, 1}));
  cpu::ReduceInto(e, s, 4, DataType::kBool, ReduceOp::kProduct);
  EXPECT_EQ(std::vector<uint8_t>(e, e + 4), (std::vector<uint8_t>{0, 0, 0, 1}));
}

// ---- ScaleCopy ----

TEST(ScaleCopy, EveryTypeFactorAndSizeInAndOutOfPlace) {
  for (DataType dtype : kAllTypes) {
    for (double factor : {1.0, 0.5, -3.0, 1.0 / 3.0, 0.0, 1e30}) {
      for (int64_t n : kSizes) {
        SCOPED_TRACE(std::string(DataTypeName(dtype)) + " factor " + std::to_string(factor) +
                     " n=" + std::to_string(n));
        const std::vector<uint8_t> in = MakeInput(dtype, n, 7 + static_cast<uint64_t>(dtype));
        std::vector<uint8_t> out(in.size() + 8, 0xa5);
        cpu::ScaleCopy(out.data(), in.data(), n, dtype, factor);
        std::vector<uint8_t> inplace = in;
        cpu::ScaleCopy(inplace.data(), inplace.data(), n, dtype, factor);
        for (int64_t i = 0; i < n; ++i) {
          CheckScaled(dtype, factor, in.data(), out.data(), i);
          CheckScaled(dtype, factor, in.data(), inplace.data(), i);
          if (HasFatalFailure()) {
            ADD_FAILURE() << "at element " << i;
            return;
          }
        }
        for (size_t b = in.size(); b < out.size(); ++b) ASSERT_EQ(out[b], 0xa5);
      }
    }
  }
}

// Powers of two take a float path (one multiply in float instead of two conversions through
// double): every bit must equal the double formula, at the edges too.
TEST(ScaleCopy, Float32PowersOfTwoMatchTheDoubleFormulaBitForBit) {
  std::vector<float> in;
  for (uint32_t b : {0x00000000u, 0x80000000u, 0x00000001u, 0x80000003u, 0x007fffffu, 0x00800000u,
                     0x00800001u, 0x00ffffffu, 0x3f800000u, 0x3f800001u, 0x7f7fffffu, 0xff7fffffu,
                     0x7f000001u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x01000000u}) {
    in.push_back(FromBits(b));
  }
  for (uint64_t i = 0; i < 20000; ++i) {  // random bit patterns, NaNs included
    in.push_back(FromBits(static_cast<uint32_t>(Mix(i + 977))));
  }
  const int64_t n = static_cast<int64_t>(in.size());
  // 2^-127 and 2^128 are not normal floats: they keep the double path; 3 * 2^-2 is no power.
  for (double factor : {0.5, 0.25, -0.5, 2.0, -4.0, std::ldexp(1.0, -126), std::ldexp(1.0, 127),
                        std::ldexp(1.0, -127), std::ldexp(1.0, 128), 0.75}) {
    SCOPED_TRACE("factor " + std::to_string(factor));
    std::vector<float> out(in.size()), inplace = in;
    cpu::ScaleCopy(out.data(), in.data(), n, DataType::kFloat32, factor);
    cpu::ScaleCopy(inplace.data(), inplace.data(), n, DataType::kFloat32, factor);
    for (int64_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(static_cast<double>(in[i]) * factor);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(out[i]) && std::isnan(inplace[i])) << i;
      } else {
        ASSERT_EQ(Bits(out[i]), Bits(want))
            << "element " << i << " bits " << std::hex << Bits(in[i]);
        ASSERT_EQ(Bits(inplace[i]), Bits(want)) << "element " << i;
      }
    }
  }
}

TEST(ScaleCopy, IntegersTruncateTowardZeroAndSaturate) {
  int32_t v[6] = {7, -7, 5, -5, 2000000000, -2000000000};
  cpu::ScaleCopy(v, v, 6, DataType::kInt32, 0.5);
  EXPECT_EQ(std::vector<int32_t>(v, v + 6),
            (std::vector<int32_t>{3, -3, 2, -2, 1000000000, -1000000000}));
  int8_t b[3] = {100, -100, 3};
  int8_t o[3];
  cpu::ScaleCopy(o, b, 3, DataType::kInt8, 2.0);
  EXPECT_EQ(std::vector<int8_t>(o, o + 3), (std::vector<int8_t>{127, -128, 6}));
  int64_t big[2] = {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  cpu::ScaleCopy(big, big, 2, DataType::kInt64, 4.0);
  EXPECT_EQ(big[0], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(big[1], std::numeric_limits<int64_t>::min());
  uint8_t u[2] = {10, 255};
  cpu::ScaleCopy(u, u, 2, DataType::kUint8, -1.0);
  EXPECT_EQ(u[0], 0);
  EXPECT_EQ(u[1], 0);
}

TEST(ScaleCopy, FactorOneCopiesBitsExactly) {
  const uint16_t in[3] = {0x7e01, 0xfc00, 0x0001};  // a NaN payload survives a plain copy
  uint16_t out[3] = {};
  cpu::ScaleCopy(out, in, 3, DataType::kFloat16, 1.0);
  EXPECT_EQ(std::memcmp(in, out, sizeof(in)), 0);
}

}  // namespace
}  // namespace hvdc

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

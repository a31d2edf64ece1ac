#include "tests/cpp/conformance/values.h"

#include <gtest/gtest.h>
#include <strings.h>

#include <algorithm>
#include <cstring>

#include "ops/cpu/kernels.h"

namespace hvdc {
namespace conformance {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool IsInteger(DataType t) { return !IsFloatingPoint(t); }

// v as an element of t holds it (wrapped to t's width).
int64_t Wrap(DataType t, uint64_t v) {
  switch (t) {
    case DataType::kUint8:
      return static_cast<uint8_t>(v);
    case DataType::kInt8:
      return static_cast<int8_t>(v);
    case DataType::kUint16:
      return static_cast<uint16_t>(v);
    case DataType::kInt16:
      return static_cast<int16_t>(v);
    case DataType::kInt32:
      return static_cast<int32_t>(v);
    case DataType::kBool:
      return v != 0;
    default:
      return static_cast<int64_t>(v);
  }
}

Elem Combine(DataType t, ReduceOp op, Elem a, Elem b) {
  Elem e;
  if (t == DataType::kBool) {
    const bool all = op == ReduceOp::kMin || op == ReduceOp::kProduct;
    e.i = all ? (a.i && b.i) : (a.i || b.i);
  } else if (IsInteger(t)) {
    const uint64_t x = static_cast<uint64_t>(a.i), y = static_cast<uint64_t>(b.i);
    switch (op) {
      case ReduceOp::kMin:
        e.i = std::min(a.i, b.i);
        break;
      case ReduceOp::kMax:
        e.i = std::max(a.i, b.i);
        break;
      case ReduceOp::kProduct:
        e.i = Wrap(t, x * y);
        break;
      default:
        e.i = Wrap(t, x + y);
        break;
    }
  } else {
    switch (op) {
      case ReduceOp::kMin:
        e.r = std::min(a.r, b.r);
        break;
      case ReduceOp::kMax:
        e.r = std::max(a.r, b.r);
        break;
      case ReduceOp::kProduct:
        e.r = a.r * b.r;
        break;
      default:
        e.r = a.r + b.r;
        break;
    }
  }
  return e;
}

}  // namespace

const std::vector<DataType>& AllDtypes() {
  static const std::vector<DataType> kAll = {
      DataType::kUint8,   DataType::kInt8,  DataType::kUint16,  DataType::kInt16,
      DataType::kInt32,   DataType::kInt64, DataType::kFloat16, DataType::kFloat32,
      DataType::kFloat64, DataType::kBool,  DataType::kBfloat16};
  return kAll;
}

const std::vector<ReduceOp>& AllReduceOps() {
  static const std::vector<ReduceOp> kAll = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                                             ReduceOp::kProduct, ReduceOp::kAverage};
  return kAll;
}

Elem Input(DataType t, ReduceOp op, int world_rank, int64_t index) {
  const uint64_t h = Mix(static_cast<uint64_t>(world_rank) * 0x100000001ull +
                         static_cast<uint64_t>(index) + (static_cast<uint64_t>(t) << 56));
  Elem e;
  if (t == DataType::kBool) {
    e.i = (h % 4) != 0;  // mostly true, so that "and" over ranks is sometimes true
  } else if (IsInteger(t)) {
    e.i = Wrap(t, h);
  } else if (op == ReduceOp::kProduct) {
    // Products over up to 8 ranks stay within float16's normal range.
    static const double kPowers[] = {0.25, 0.5, 1, 2, 4, -0.5, -1, -2};
    e.r = kPowers[h % 8];
  } else {
    e.r = (static_cast<int64_t>(h % 33) - 16) / 4.0;  // sums over 8 ranks are exact in bfloat16
  }
  return e;
}

Elem Expected(DataType t, ReduceOp op, const std::vector<int>& members, int64_t index) {
  Elem e = Input(t, op, members[0], index);
  for (size_t k = 1; k < members.size(); ++k)
    e = Combine(t, op, e, Input(t, op, members[k], index));
  return e;
}

std::string ToString(DataType t, Elem e) {
  return IsInteger(t) ? std::to_string(e.i) : std::to_string(e.r);
}

void Write(DataType t, void* buf, int64_t index, Elem e) {
  char* p = static_cast<char*>(buf) + index * static_cast<int64_t>(DataTypeSize(t));
  auto put = [p](auto v) { std::memcpy(p, &v, sizeof(v)); };
  switch (t) {
    case DataType::kUint8:
    case DataType::kBool:
      return put(static_cast<uint8_t>(e.i));
    case DataType::kInt8:
      return put(static_cast<int8_t>(e.i));
    case DataType::kUint16:
      return put(static_cast<uint16_t>(e.i));
    case DataType::kInt16:
      return put(static_cast<int16_t>(e.i));
    case DataType::kInt32:
      return put(static_cast<int32_t>(e.i));
    case DataType::kInt64:
      return put(static_cast<int64_t>(e.i));
    case DataType::kFloat16:
      return put(cpu::FloatToHalf(static_cast<float>(e.r)));  // exact for these inputs
    case DataType::kBfloat16:
      return put(cpu::FloatToBfloat16(static_cast<float>(e.r)));
    case DataType::kFloat32:
      return put(static_cast<float>(e.r));
    case DataType::kFloat64:
      return put(e.r);
  }
}

Elem Read(DataType t, const void* buf, int64_t index) {
  const char* p = static_cast<const char*>(buf) + index * static_cast<int64_t>(DataTypeSize(t));
  auto get = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  Elem e;
  switch (t) {
    case DataType::kUint8:
    case DataType::kBool:
      e.i = get(uint8_t{});
      break;
    case DataType::kInt8:
      e.i = get(int8_t{});
      break;
    case DataType::kUint16:
      e.i = get(uint16_t{});
      break;
    case DataType::kInt16:
      e.i = get(int16_t{});
      break;
    case DataType::kInt32:
      e.i = get(int32_t{});
      break;
    case DataType::kInt64:
      e.i = get(int64_t{});
      break;
    case DataType::kFloat16:
      e.r = cpu::HalfToFloat(get(uint16_t{}));
      break;
    case DataType::kBfloat16:
      e.r = cpu::Bfloat16ToFloat(get(uint16_t{}));
      break;
    case DataType::kFloat32:
      e.r = get(float{});
      break;
    case DataType::kFloat64:
      e.r = get(double{});
      break;
  }
  return e;
}

std::vector<uint8_t> Inputs(DataType t, ReduceOp op, int world_rank, int64_t count, int64_t first) {
  std::vector<uint8_t> buf(static_cast<size_t>(count) * DataTypeSize(t) + 1, 0xee);
  for (int64_t i = 0; i < count; ++i) Write(t, buf.data(), i, Input(t, op, world_rank, first + i));
  return buf;
}

bool CheckReduced(DataType t, ReduceOp op, const std::vector<int>& members, const void* buf,
                  int64_t count, int64_t first, const std::string& what) {
  for (int64_t i = 0; i < count; ++i) {
    const Elem want = Expected(t, op, members, first + i);
    const Elem got = Read(t, buf, i);
    if (!(got == want)) {
      ADD_FAILURE() << what << ": " << DataTypeName(t) << " " << ReduceOpName(op) << " element "
                    << i << " of " << count << ": got " << ToString(t, got) << ", want "
                    << ToString(t, want);
      return false;
    }
  }
  return true;
}

int64_t FirstBadByte(const uint8_t* buf, int64_t n, int from, int to) {
  for (int64_t i = 0; i < n; ++i) {
    if (buf[i] != Byte(from, to, i)) return i;
  }
  return -1;
}

::testing::AssertionResult IsError(const Status& s, StatusCode code, const std::string& names) {
  if (s.code() != code) {
    return ::testing::AssertionFailure()
           << "expected code " << static_cast<int>(code) << ", got " << s.ToString();
  }
  const std::string& m = s.message();
  for (size_t i = 0; i + names.size() <= m.size(); ++i) {
    if (strncasecmp(m.c_str() + i, names.c_str(), names.size()) == 0) {
      return ::testing::AssertionSuccess();
    }
  }
  return ::testing::AssertionFailure() << "message does not name \"" << names << "\": " << m;
}

}  // namespace conformance
}  // namespace hvdc

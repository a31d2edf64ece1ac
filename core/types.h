// The fixed enums shared by the core, the backends and the C API (values are part of the C ABI
// and of the TF op attributes, so they never change).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hvdc {

enum class DataType : int32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBool = 9,
  kBfloat16 = 10,
};
constexpr int kNumDataTypes = 11;

// Horovod's values: Average is folded into the postscale factor by the core.
enum class ReduceOp : int32_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};

enum class OpType : int32_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
};

bool IsValidDataType(int32_t v);
bool IsValidReduceOp(int32_t v);
bool IsValidOpType(int32_t v);
size_t DataTypeSize(DataType t);
const char* DataTypeName(DataType t);
const char* ReduceOpName(ReduceOp op);
const char* OpTypeName(OpType op);  // "ALLREDUCE", ... (timeline and error messages)
// The collectives that move tensor data: all but barrier and join.
bool IsDataCollective(OpType op);
bool IsFloatingPoint(DataType t);

using Shape = std::vector<int64_t>;
int64_t NumElements(const Shape& shape);
std::string ShapeString(const Shape& shape);  // "[2, 3]"

}  // namespace hvdc

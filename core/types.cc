#include "core/types.h"

namespace hvdc {

bool IsValidDataType(int32_t v) { return v >= 0 && v < kNumDataTypes; }
bool IsValidReduceOp(int32_t v) { return v >= 0 && v <= static_cast<int32_t>(ReduceOp::kProduct); }
bool IsValidOpType(int32_t v) { return v >= 0 && v <= static_cast<int32_t>(OpType::kJoin); }

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kUint8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kUint16:
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

const char* DataTypeName(DataType t) {
  static const char* const kNames[kNumDataTypes] = {"uint8",   "int8",  "uint16",  "int16",
                                                    "int32",   "int64", "float16", "float32",
                                                    "float64", "bool",  "bfloat16"};
  int i = static_cast<int>(t);
  return (i >= 0 && i < kNumDataTypes) ? kNames[i] : "invalid";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage:
      return "Average";
    case ReduceOp::kSum:
      return "Sum";
    case ReduceOp::kAdasum:
      return "Adasum";
    case ReduceOp::kMin:
      return "Min";
    case ReduceOp::kMax:
      return "Max";
    case ReduceOp::kProduct:
      return "Product";
  }
  return "invalid";
}

const char* OpTypeName(OpType op) {
  switch (op) {
    case OpType::kAllreduce:
      return "ALLREDUCE";
    case OpType::kAllgather:
      return "ALLGATHER";
    case OpType::kBroadcast:
      return "BROADCAST";
    case OpType::kAlltoall:
      return "ALLTOALL";
    case OpType::kReducescatter:
      return "REDUCESCATTER";
    case OpType::kBarrier:
      return "BARRIER";
    case OpType::kJoin:
      return "JOIN";
  }
  return "INVALID";
}

bool IsFloatingPoint(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kFloat32 || t == DataType::kFloat64 ||
         t == DataType::kBfloat16;
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

bool IsDataCollective(OpType op) {
  switch (op) {
    case OpType::kAllreduce:
    case OpType::kAllgather:
    case OpType::kBroadcast:
    case OpType::kAlltoall:
    case OpType::kReducescatter:
      return true;
    case OpType::kBarrier:
    case OpType::kJoin:
      return false;
  }
  return false;
}

}  // namespace hvdc

// Closed-form inputs and expected results for the conformance suites: element i of world rank r is
// Input(dtype, op, r, i); the expected reduction over a set's members is computed here. Integer
// inputs span each type's whole range (sums and products wrap, as the kernels do); float inputs
// are small multiples of 1/4 (sums) or powers of two (products), so every reduction is exact in
// any order and every dtype, float16/bfloat16 included: results are compared exactly.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace hvdc {
namespace conformance {

// Every dtype with CPU kernels, and every reduce op a HostComm takes (Average reduces as Sum: the
// caller folds 1/size into a postscale).
const std::vector<DataType>& AllDtypes();
const std::vector<ReduceOp>& AllReduceOps();

// One element: an integer (integer types and bool) or a real (float types).
struct Elem {
  int64_t i = 0;
  double r = 0;
  bool operator==(const Elem& o) const { return i == o.i && r == o.r; }
};

Elem Input(DataType t, ReduceOp op, int world_rank, int64_t index);
// The reduction over members (world ranks, in set order) of their Input at index.
Elem Expected(DataType t, ReduceOp op, const std::vector<int>& members, int64_t index);
std::string ToString(DataType t, Elem e);

void Write(DataType t, void* buf, int64_t index, Elem e);
Elem Read(DataType t, const void* buf, int64_t index);

// count elements of Input(t, op, world_rank, first + i), plus one guard byte 0xee at the end.
std::vector<uint8_t> Inputs(DataType t, ReduceOp op, int world_rank, int64_t count,
                            int64_t first = 0);

// Checks buf[0..count) against Expected(first + i); ADD_FAILUREs the first mismatch only (with
// `what`) and returns whether all matched.
bool CheckReduced(DataType t, ReduceOp op, const std::vector<int>& members, const void* buf,
                  int64_t count, int64_t first, const std::string& what);

// Bytes for the data-movement collectives: distinct across (from, to, index).
inline uint8_t Byte(int from, int to, int64_t i) {
  return static_cast<uint8_t>(from * 131 + to * 29 + i * 7 + 1);
}

// The first mismatch of buf[0..n) against Byte(from, to, i), or -1.
int64_t FirstBadByte(const uint8_t* buf, int64_t n, int from, int to);

// Status checks that do not pin the message text: the code, and that the message names what was
// wrong (case-insensitive substring).
::testing::AssertionResult IsError(const Status& s, StatusCode code, const std::string& names);

}  // namespace conformance
}  // namespace hvdc

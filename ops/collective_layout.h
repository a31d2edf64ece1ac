// The layout rules of the collectives whose output is not shaped like their input, written once
// for every backend (host memory and NCCL), so that both split, stack and allocate alike: how many
// rows each member sends, receives and keeps, and the shape of this rank's output. A row is one
// index of the first dimension; a scalar counts as one row of one element.
#pragma once

#include <cstdint>
#include <vector>

#include "core/message.h"
#include "core/status.h"
#include "core/tensor_entry.h"
#include "core/types.h"

namespace hvdc {

// Elements of one row: the product of every dimension after the first.
int64_t RowElements(const Shape& shape);

// `shape` with `rows` as its first dimension (a scalar becomes a vector of `rows`).
Shape WithFirstDim(const Shape& shape, int64_t rows);

// Allgather: the output stacks every member's rows (Response::first_dims) in rank order.
struct AllgatherLayout {
  int64_t row_bytes = 0;
  bool even = true;  // every member sends as many rows
  Shape out_shape;
  int64_t out_bytes = 0;
};
AllgatherLayout LayOutAllgather(const Response& r, DataType dtype);

// Alltoall: Response::splits is the size x size matrix of the rows member i sends member j. The
// output stacks the rows received from every member in rank order.
struct AlltoallLayout {
  std::vector<int64_t> send_bytes;  // to each member, consecutive in the input
  std::vector<int64_t> recv_bytes;  // from each member, consecutive in the output
  Shape out_shape;
  int64_t out_bytes = 0;
};
// Also writes the rows received from each member into received_splits (size entries) when it
// is not null: the caller sees them with the output.
AlltoallLayout LayOutAlltoall(const Response& r, DataType dtype, int size, int rank,
                              int32_t* received_splits);

// Reducescatter: the rows are split as evenly as they go, the first (rows % size) members keeping
// one more; member p keeps the reduction of its block.
struct ReducescatterLayout {
  std::vector<int64_t> counts;  // elements each member keeps, consecutive in the input
  int64_t total = 0;            // elements of the input
  bool even = true;             // every member keeps as many
  Shape out_shape;              // this rank's block
};
ReducescatterLayout LayOutReducescatter(const Shape& shape, int size, int rank);

// Asks the entry's allocator for an output of `shape` and records the answer in entry.output:
// null when there is no allocator or it failed. A rank whose allocation failed still takes part
// in the collective (into scratch memory), so that its peers' calls are matched, and then fails
// the tensor with OutputAllocationFailed.
void* AllocateOutput(TensorEntry& entry, const Shape& shape);
Status OutputAllocationFailed(const Response& r, const Shape& shape);

}  // namespace hvdc

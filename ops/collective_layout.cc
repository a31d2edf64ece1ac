#include "ops/collective_layout.h"

#include <fmt/format.h>

namespace hvdc {

int64_t RowElements(const Shape& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

Shape WithFirstDim(const Shape& shape, int64_t rows) {
  Shape out = shape.empty() ? Shape{rows} : shape;
  out[0] = rows;
  return out;
}

AllgatherLayout LayOutAllgather(const Response& r, DataType dtype) {
  AllgatherLayout l;
  l.row_bytes = RowElements(r.shape) * static_cast<int64_t>(DataTypeSize(dtype));
  int64_t rows = 0;
  for (int64_t d : r.first_dims) {
    rows += d;
    l.even = l.even && d == r.first_dims.front();
  }
  l.out_shape = WithFirstDim(r.shape, rows);
  l.out_bytes = rows * l.row_bytes;
  return l;
}

AlltoallLayout LayOutAlltoall(const Response& r, DataType dtype, int size, int rank,
                              int32_t* received_splits) {
  const int64_t row_bytes = RowElements(r.shape) * static_cast<int64_t>(DataTypeSize(dtype));
  AlltoallLayout l;
  l.send_bytes.resize(static_cast<size_t>(size));
  l.recv_bytes.resize(static_cast<size_t>(size));
  int64_t rows = 0;
  for (int p = 0; p < size; ++p) {
    l.send_bytes[p] = r.splits[static_cast<size_t>(rank) * size + p] * row_bytes;
    const int64_t in_rows = r.splits[static_cast<size_t>(p) * size + rank];
    l.recv_bytes[p] = in_rows * row_bytes;
    rows += in_rows;
    if (received_splits) received_splits[p] = static_cast<int32_t>(in_rows);
  }
  l.out_shape = WithFirstDim(r.shape, rows);
  l.out_bytes = rows * row_bytes;
  return l;
}

ReducescatterLayout LayOutReducescatter(const Shape& shape, int size, int rank) {
  const int64_t rows = shape.empty() ? 1 : shape[0];
  const int64_t row = RowElements(shape);
  auto kept_rows = [&](int p) { return rows / size + (p < rows % size ? 1 : 0); };
  ReducescatterLayout l;
  l.counts.resize(static_cast<size_t>(size));
  for (int p = 0; p < size; ++p) {
    l.counts[p] = kept_rows(p) * row;
    l.even = l.even && l.counts[p] == l.counts[0];
  }
  l.total = rows * row;
  l.out_shape = WithFirstDim(shape, kept_rows(rank));
  return l;
}

void* AllocateOutput(TensorEntry& entry, const Shape& shape) {
  entry.output = entry.allocate ? entry.allocate(shape) : nullptr;
  return entry.output;
}

Status OutputAllocationFailed(const Response& r, const Shape& shape) {
  return Status::UnknownError(
      fmt::format("could not allocate the output {} of tensor '{}'", ShapeString(shape), r.name));
}

}  // namespace hvdc

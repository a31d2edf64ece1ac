// TcpHostComm's reducing collectives: Allreduce and ReduceScatter (see tcp_host_comm.h).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "ops/cpu/kernels.h"
#include "tcp_controller/tcp_host_comm.h"

namespace hvdc {
namespace tcp {

Status TcpHostComm::RecvReduce(int r, uint8_t* dst, int64_t elems, DataType dtype, ReduceOp op) {
  std::string m;
  HVDC_RETURN_IF_ERROR(group_.RecvMessage(r, &m));
  const size_t want = static_cast<size_t>(elems) * DataTypeSize(dtype);
  if (m.size() != want) {
    return Status::PreconditionError(
        fmt::format("TCP reduction: rank {} sent {} bytes where this rank expected {} (the ranks "
                    "disagree about the operation)",
                    group_.world_rank(r), m.size(), want));
  }
  cpu::ReduceInto(dst, m.data(), elems, dtype, op);
  group_.Recycle(std::move(m));
  return Status::OK();
}

Status TcpHostComm::RecursiveDoubling(uint8_t* buf, int64_t count, DataType dtype, ReduceOp op) {
  const int n = size(), r = rank();
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2;
  // Fold: rank p2 + i hands its values to rank i and gets the result back at the end.
  if (r >= p2) {
    HVDC_RETURN_IF_ERROR(group_.Send(r - p2, buf, bytes));
    return group_.Recv(r - p2, buf, bytes);
  }
  if (r < extra) HVDC_RETURN_IF_ERROR(RecvReduce(r + p2, buf, count, dtype, op));
  std::string theirs;
  for (int mask = 1; mask < p2; mask <<= 1) {
    const int partner = r ^ mask;
    HVDC_RETURN_IF_ERROR(group_.Send(partner, buf, bytes));
    HVDC_RETURN_IF_ERROR(group_.RecvMessage(partner, &theirs));
    if (theirs.size() != bytes) {
      return Status::PreconditionError(
          fmt::format("Allreduce: rank {} sent {} bytes where this rank expected {}",
                      group_.world_rank(partner), theirs.size(), bytes));
    }
    // The lower rank's values always come first, so both partners compute the same bits.
    if (r < partner) {
      cpu::ReduceInto(buf, theirs.data(), count, dtype, op);
    } else {
      cpu::ReduceInto(&theirs[0], buf, count, dtype, op);
      std::memcpy(buf, theirs.data(), bytes);
    }
  }
  if (r < extra) HVDC_RETURN_IF_ERROR(group_.Send(r + p2, buf, bytes));
  return Status::OK();
}

Status TcpHostComm::RingReduceScatter(uint8_t* buf, const std::vector<int64_t>& offsets,
                                      DataType dtype, ReduceOp op) {
  const int n = size(), r = rank();
  const int64_t esize = static_cast<int64_t>(DataTypeSize(dtype));
  const int64_t seg = std::max<int64_t>(1, segment_bytes_ / esize);
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  auto segments = [&](int b) { return (offsets[b + 1] - offsets[b] + seg - 1) / seg; };
  // Step s: send block r-s-1 (reduced so far) to the right, reduce block r-s-2 from the left into
  // ours. After n-1 steps block r is complete here.
  for (int s = 0; s < n - 1; ++s) {
    const int sb = ((r - s - 1) % n + n) % n, rb = ((r - s - 2) % n + n) % n;
    const int64_t ns = segments(sb), nr = segments(rb);
    for (int64_t k = 0; k < std::max(ns, nr); ++k) {
      if (k < ns) {
        const int64_t lo = offsets[sb] + k * seg, hi = std::min(lo + seg, offsets[sb + 1]);
        HVDC_RETURN_IF_ERROR(
            group_.Send(right, buf + lo * esize, static_cast<size_t>((hi - lo) * esize)));
      }
      if (k < nr) {
        const int64_t lo = offsets[rb] + k * seg, hi = std::min(lo + seg, offsets[rb + 1]);
        HVDC_RETURN_IF_ERROR(RecvReduce(left, buf + lo * esize, hi - lo, dtype, op));
      }
    }
  }
  return Status::OK();
}

Status TcpHostComm::RingAllgather(uint8_t* buf, const std::vector<int64_t>& offsets,
                                  size_t esize_u) {
  const int n = size(), r = rank();
  const int64_t esize = static_cast<int64_t>(esize_u);
  const int64_t seg = std::max<int64_t>(1, segment_bytes_ / esize);
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  auto segments = [&](int b) { return (offsets[b + 1] - offsets[b] + seg - 1) / seg; };
  for (int s = 0; s < n - 1; ++s) {
    const int sb = ((r - s) % n + n) % n, rb = ((r - s - 1) % n + n) % n;
    const int64_t ns = segments(sb), nr = segments(rb);
    for (int64_t k = 0; k < std::max(ns, nr); ++k) {
      if (k < ns) {
        const int64_t lo = offsets[sb] + k * seg, hi = std::min(lo + seg, offsets[sb + 1]);
        HVDC_RETURN_IF_ERROR(
            group_.Send(right, buf + lo * esize, static_cast<size_t>((hi - lo) * esize)));
      }
      if (k < nr) {
        const int64_t lo = offsets[rb] + k * seg, hi = std::min(lo + seg, offsets[rb + 1]);
        HVDC_RETURN_IF_ERROR(
            group_.Recv(left, buf + lo * esize, static_cast<size_t>((hi - lo) * esize)));
      }
    }
  }
  return Status::OK();
}

Status TcpHostComm::DoAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                ReduceOp op) {
  const size_t esize = DataTypeSize(dtype);
  const size_t bytes = static_cast<size_t>(count) * esize;
  if (bytes > 0 && send != recv) std::memmove(recv, send, bytes);
  if (size() == 1 || count == 0) return Status::OK();
  auto* buf = static_cast<uint8_t*>(recv);
  const int n = size();
  if (static_cast<int64_t>(bytes) <= kSmallBytes || count < n) {
    return RecursiveDoubling(buf, count, dtype, op);
  }
  std::vector<int64_t> offsets(n + 1);
  for (int b = 0; b <= n; ++b) offsets[b] = count * b / n;
  HVDC_RETURN_IF_ERROR(RingReduceScatter(buf, offsets, dtype, op));
  return RingAllgather(buf, offsets, esize);
}

Status TcpHostComm::DoReduceScatter(const void* send, void* recv,
                                    const std::vector<int64_t>& recv_counts, DataType dtype,
                                    ReduceOp op) {
  const int n = size();
  const size_t esize = DataTypeSize(dtype);
  std::vector<int64_t> offsets(n + 1, 0);
  for (int b = 0; b < n; ++b) offsets[b + 1] = offsets[b] + recv_counts[b];
  const size_t own = static_cast<size_t>(recv_counts[rank()]) * esize;
  if (n == 1) {
    if (own > 0 && send != recv) std::memmove(recv, send, own);
    return Status::OK();
  }
  std::vector<uint8_t> work(static_cast<const uint8_t*>(send),
                            static_cast<const uint8_t*>(send) + offsets[n] * esize);
  HVDC_RETURN_IF_ERROR(RingReduceScatter(work.data(), offsets, dtype, op));
  if (own > 0) std::memcpy(recv, work.data() + offsets[rank()] * esize, own);
  return Status::OK();
}

}  // namespace tcp
}  // namespace hvdc

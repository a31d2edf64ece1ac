// HostComm: the data-plane primitives a CPU backend needs, over host memory, for one process set.
// Implemented by each transport: mpi_controller/ (MPI communicators), tcp_controller/ (ring and
// tree algorithms over TCP) and local_controller/ (threads in one process, for tests and the
// single-rank runtime); a shared-memory plane will be another. All calls are blocking and
// collective over the set, and are made from one executor thread per process set.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace hvdc {

class HostComm {
 public:
  virtual ~HostComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[i] = op over ranks of send[i]; send == recv means in place. op is Sum, Min, Max or
  // Product (Average is folded into a postscale by the caller). Any count (>= 0) is accepted.
  virtual Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                           ReduceOp op) = 0;
  // Concatenates every rank's send bytes in rank order; recv_bytes[r] is rank r's length.
  virtual Status Allgatherv(const void* send, int64_t send_bytes, void* recv,
                            const std::vector<int64_t>& recv_bytes) = 0;
  // Replaces buf on every rank with root's bytes (root is a rank within this set).
  virtual Status Broadcast(void* buf, int64_t bytes, int root) = 0;
  // send_bytes[r]: bytes of send (consecutive blocks, rank order) for rank r; recv_bytes[r]:
  // bytes received from rank r, placed consecutively in rank order.
  virtual Status Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                           const std::vector<int64_t>& recv_bytes) = 0;
  // Reduces send (sum over ranks of recv_counts elements) and leaves block r on rank r.
  virtual Status ReduceScatter(const void* send, void* recv,
                               const std::vector<int64_t>& recv_counts, DataType dtype,
                               ReduceOp op) = 0;
  virtual Status Barrier() = 0;
};

}  // namespace hvdc

#include "core/self_comm.h"

#include <cstring>

namespace hvdc {
namespace {

void CopyBytes(const void* send, void* recv, int64_t bytes) {
  if (bytes > 0 && send != recv) std::memcpy(recv, send, static_cast<size_t>(bytes));
}

}  // namespace

// The arguments are checked (HostComm): the sizes agree with one rank, the root is 0.
Status SelfComm::DoAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                             ReduceOp /*op*/) {
  CopyBytes(send, recv, count * static_cast<int64_t>(DataTypeSize(dtype)));
  return Status::OK();
}

Status SelfComm::DoAllgatherv(const void* send, int64_t send_bytes, void* recv,
                              const std::vector<int64_t>& /*recv_bytes*/) {
  CopyBytes(send, recv, send_bytes);
  return Status::OK();
}

Status SelfComm::DoAlltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                             const std::vector<int64_t>& /*recv_bytes*/) {
  CopyBytes(send, recv, send_bytes[0]);
  return Status::OK();
}

Status SelfComm::DoReduceScatter(const void* send, void* recv,
                                 const std::vector<int64_t>& recv_counts, DataType dtype,
                                 ReduceOp /*op*/) {
  CopyBytes(send, recv, recv_counts[0] * static_cast<int64_t>(DataTypeSize(dtype)));
  return Status::OK();
}

}  // namespace hvdc

#include "core/self_comm.h"

#include <cstring>

namespace hvdc {
namespace {

void CopyBytes(const void* send, void* recv, int64_t bytes) {
  if (bytes > 0 && send != recv) std::memcpy(recv, send, static_cast<size_t>(bytes));
}

Status SizeMismatch(const char* what) {
  return Status::InvalidArgument(std::string(what) + " over one rank: sizes do not match");
}

}  // namespace

Status SelfComm::Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                           ReduceOp /*op*/) {
  CopyBytes(send, recv, count * static_cast<int64_t>(DataTypeSize(dtype)));
  return Status::OK();
}

Status SelfComm::Allgatherv(const void* send, int64_t send_bytes, void* recv,
                            const std::vector<int64_t>& recv_bytes) {
  if (recv_bytes.size() != 1 || recv_bytes[0] != send_bytes) return SizeMismatch("allgather");
  CopyBytes(send, recv, send_bytes);
  return Status::OK();
}

Status SelfComm::Broadcast(void* /*buf*/, int64_t /*bytes*/, int root) {
  if (root != 0) return Status::InvalidArgument("broadcast over one rank: the root must be 0");
  return Status::OK();
}

Status SelfComm::Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                           const std::vector<int64_t>& recv_bytes) {
  if (send_bytes.size() != 1 || recv_bytes.size() != 1 || send_bytes[0] != recv_bytes[0]) {
    return SizeMismatch("alltoall");
  }
  CopyBytes(send, recv, send_bytes[0]);
  return Status::OK();
}

Status SelfComm::ReduceScatter(const void* send, void* recv,
                               const std::vector<int64_t>& recv_counts, DataType dtype,
                               ReduceOp /*op*/) {
  if (recv_counts.size() != 1) return SizeMismatch("reducescatter");
  CopyBytes(send, recv, recv_counts[0] * static_cast<int64_t>(DataTypeSize(dtype)));
  return Status::OK();
}

}  // namespace hvdc

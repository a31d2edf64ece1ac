// The argument checks every HostComm call passes through (see host_comm.h).
#include "core/host_comm.h"

#include <fmt/format.h>

#include <utility>

namespace hvdc {
namespace {

Status CheckReduction(const char* what, DataType dtype, ReduceOp op) {
  if (!IsValidDataType(static_cast<int32_t>(dtype))) {
    return Status::InvalidArgument(
        fmt::format("{}: invalid data type {}", what, static_cast<int32_t>(dtype)));
  }
  if (op != ReduceOp::kSum && op != ReduceOp::kAverage && op != ReduceOp::kMin &&
      op != ReduceOp::kMax && op != ReduceOp::kProduct) {
    return Status::InvalidArgument(
        fmt::format("{}: reduce op {} ({}) is not supported by the host data plane", what,
                    ReduceOpName(op), static_cast<int32_t>(op)));
  }
  return Status::OK();
}

// One non-negative length per member of the set.
Status CheckPerRank(const char* what, const char* name, const std::vector<int64_t>& v, int size) {
  if (v.size() != static_cast<size_t>(size)) {
    return Status::InvalidArgument(
        fmt::format("{}: {} has {} entries for {} ranks", what, name, v.size(), size));
  }
  for (size_t r = 0; r < v.size(); ++r) {
    if (v[r] < 0) {
      return Status::InvalidArgument(
          fmt::format("{}: {}[{}] is negative ({})", what, name, r, v[r]));
    }
  }
  return Status::OK();
}

}  // namespace

const char* HostComm::CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return "Allreduce";
    case Collective::kAllgatherv:
      return "Allgatherv";
    case Collective::kBroadcast:
      return "Broadcast";
    case Collective::kAlltoallv:
      return "Alltoallv";
    case Collective::kReduceScatter:
      return "ReduceScatter";
    case Collective::kBarrier:
      return "Barrier";
  }
  return "?";
}

Status HostComm::Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                           ReduceOp op) {
  Status bad = count < 0 ? Status::InvalidArgument("Allreduce: negative count")
                         : CheckReduction("Allreduce", dtype, op);
  if (!bad.ok()) return Refuse(Collective::kAllreduce, std::move(bad));
  return DoAllreduce(send, recv, count, dtype, op);
}

Status HostComm::Allgatherv(const void* send, int64_t send_bytes, void* recv,
                            const std::vector<int64_t>& recv_bytes) {
  Status bad = send_bytes < 0 ? Status::InvalidArgument("Allgatherv: negative send_bytes")
                              : CheckPerRank("Allgatherv", "recv_bytes", recv_bytes, size());
  if (bad.ok() && recv_bytes[rank()] != send_bytes) {
    bad = Status::InvalidArgument(
        fmt::format("Allgatherv: send_bytes {} differs from recv_bytes[{}] {}", send_bytes, rank(),
                    recv_bytes[rank()]));
  }
  if (!bad.ok()) return Refuse(Collective::kAllgatherv, std::move(bad));
  return DoAllgatherv(send, send_bytes, recv, recv_bytes);
}

Status HostComm::Broadcast(void* buf, int64_t bytes, int root) {
  Status bad;
  if (bytes < 0) {
    bad = Status::InvalidArgument("Broadcast: negative byte count");
  } else if (root < 0 || root >= size()) {
    bad = Status::InvalidArgument(
        fmt::format("Broadcast: root {} is not a rank of a set of size {}", root, size()));
  }
  if (!bad.ok()) return Refuse(Collective::kBroadcast, std::move(bad));
  return DoBroadcast(buf, bytes, root);
}

Status HostComm::Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                           const std::vector<int64_t>& recv_bytes) {
  Status bad = CheckPerRank("Alltoallv", "send_bytes", send_bytes, size());
  if (bad.ok()) bad = CheckPerRank("Alltoallv", "recv_bytes", recv_bytes, size());
  if (bad.ok() && send_bytes[rank()] != recv_bytes[rank()]) {
    bad = Status::InvalidArgument(
        fmt::format("Alltoallv: this rank sends itself {} bytes but expects {}", send_bytes[rank()],
                    recv_bytes[rank()]));
  }
  if (!bad.ok()) return Refuse(Collective::kAlltoallv, std::move(bad));
  return DoAlltoallv(send, send_bytes, recv, recv_bytes);
}

Status HostComm::ReduceScatter(const void* send, void* recv,
                               const std::vector<int64_t>& recv_counts, DataType dtype,
                               ReduceOp op) {
  Status bad = CheckPerRank("ReduceScatter", "recv_counts", recv_counts, size());
  if (bad.ok()) bad = CheckReduction("ReduceScatter", dtype, op);
  if (!bad.ok()) return Refuse(Collective::kReduceScatter, std::move(bad));
  return DoReduceScatter(send, recv, recv_counts, dtype, op);
}

Status HostComm::Refuse(Collective /*c*/, Status error) { return error; }

}  // namespace hvdc

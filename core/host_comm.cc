// The argument checks every HostComm call passes through (see host_comm.h).
#include "core/host_comm.h"

#include <fmt/format.h>

#include <algorithm>
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

struct Span {
  uintptr_t begin, end;
};

}  // namespace

bool PiecesOverlap(const std::vector<ReducePiece>& pieces, int64_t element_size) {
  std::vector<Span> writes, reads;
  for (const ReducePiece& p : pieces) {
    if (p.count <= 0) continue;
    const auto bytes = static_cast<uintptr_t>(p.count * element_size);
    const auto in = reinterpret_cast<uintptr_t>(p.in), out = reinterpret_cast<uintptr_t>(p.out);
    if (p.out != nullptr) writes.push_back({out, out + bytes});
    if (p.in != nullptr && p.in != p.out) reads.push_back({in, in + bytes});
  }
  auto by_begin = [](const Span& a, const Span& b) { return a.begin < b.begin; };
  std::sort(writes.begin(), writes.end(), by_begin);
  for (size_t i = 1; i < writes.size(); ++i) {
    if (writes[i].begin < writes[i - 1].end) return true;
  }
  // The writes are disjoint and sorted, so their ends are sorted too. Reads may overlap reads.
  for (const Span& r : reads) {
    auto w = std::upper_bound(writes.begin(), writes.end(), r.begin,
                              [](uintptr_t a, const Span& s) { return a < s.end; });
    if (w != writes.end() && w->begin < r.end) return true;
  }
  return false;
}

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

Status HostComm::AllreducePieces(const std::vector<ReducePiece>& pieces, DataType dtype,
                                 ReduceOp op, double prescale, double postscale) {
  if (!allreduces_pieces()) {
    return Status::PreconditionError("AllreducePieces: this data plane does not implement it");
  }
  Status bad = CheckReduction("AllreducePieces", dtype, op);
  for (size_t i = 0; i < pieces.size() && bad.ok(); ++i) {
    if (pieces[i].count < 0) {
      bad = Status::InvalidArgument(
          fmt::format("AllreducePieces: piece {} has a negative count ({})", i, pieces[i].count));
    }
  }
  if (bad.ok() && PiecesOverlap(pieces, static_cast<int64_t>(DataTypeSize(dtype)))) {
    bad = Status::InvalidArgument(
        "AllreducePieces: an output overlaps another piece's memory (only in == out is allowed)");
  }
  if (!bad.ok()) return Refuse(Collective::kAllreduce, std::move(bad));
  return DoAllreducePieces(pieces, dtype, op, prescale, postscale);
}

Status HostComm::DoAllreducePieces(const std::vector<ReducePiece>& /*pieces*/, DataType /*dtype*/,
                                   ReduceOp /*op*/, double /*prescale*/, double /*postscale*/) {
  return Status::PreconditionError("AllreducePieces: this data plane does not implement it");
}

Status HostComm::Refuse(Collective /*c*/, Status error) { return error; }

}  // namespace hvdc

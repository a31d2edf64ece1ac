#include "local_controller/local_host_comm.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "ops/cpu/kernels.h"

namespace hvdc {
namespace local {
namespace {

enum class HostKind : int {
  kAllreduce = 1,
  kAllgatherv,
  kBroadcast,
  kAlltoallv,
  kReduceScatter,
  kBarrier,
};

const char* HostKindName(int kind) {
  switch (static_cast<HostKind>(kind)) {
    case HostKind::kAllreduce:
      return "Allreduce";
    case HostKind::kAllgatherv:
      return "Allgatherv";
    case HostKind::kBroadcast:
      return "Broadcast";
    case HostKind::kAlltoallv:
      return "Alltoallv";
    case HostKind::kReduceScatter:
      return "ReduceScatter";
    case HostKind::kBarrier:
      return "Barrier";
  }
  return "?";
}

// One rank's arguments, published to its peers (lives on that rank's stack).
struct Call {
  const uint8_t* send = nullptr;
  uint8_t* recv = nullptr;  // Broadcast: the buffer
  int64_t count = 0;        // Allreduce: elements; Allgatherv: send bytes; Broadcast: bytes
  DataType dtype = DataType::kUint8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  const std::vector<int64_t>* sizes = nullptr;       // Allgatherv/Alltoallv: recv_bytes
  const std::vector<int64_t>* send_sizes = nullptr;  // Alltoallv: send_bytes
  const uint8_t* block = nullptr;                    // Allreduce: this rank's reduced block
};

void Copy(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

bool Overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  if (a_bytes <= 0 || b_bytes <= 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + static_cast<uintptr_t>(b_bytes) && pb < pa + static_cast<uintptr_t>(a_bytes);
}

int64_t Prefix(const std::vector<int64_t>& v, int end) {
  int64_t sum = 0;
  for (int i = 0; i < end; ++i) sum += v[i];
  return sum;
}

bool ValidReduce(DataType dtype, ReduceOp op) {
  return IsValidDataType(static_cast<int32_t>(dtype)) &&
         (op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kMin ||
          op == ReduceOp::kMax || op == ReduceOp::kProduct);
}

Status CheckReduce(const char* what, DataType dtype, ReduceOp op) {
  if (ValidReduce(dtype, op)) return Status::OK();
  return Status::InvalidArgument(fmt::format("{}: unsupported dtype/reduce op ({}, {})", what,
                                             static_cast<int>(dtype), static_cast<int>(op)));
}

Status CheckSizes(const char* what, const char* name, const std::vector<int64_t>& v, int size) {
  if (static_cast<int>(v.size()) != size) {
    return Status::InvalidArgument(
        fmt::format("{}: {} has {} entries for {} ranks", what, name, v.size(), size));
  }
  for (int64_t x : v) {
    if (x < 0) return Status::InvalidArgument(fmt::format("{}: negative {} {}", what, name, x));
  }
  return Status::OK();
}

bool SizesOk(const std::vector<int64_t>& v, int size) { return CheckSizes("", "", v, size).ok(); }

// One call's place on the rendezvous. Every path after a successful Arrive ends in Finish() (a last
// Sync, then Release) or, when a Sync has already fenced the last read of peer memory, Leave().
class Meeting {
 public:
  Meeting(Rendezvous* rendezvous, int rank, uint64_t seq)
      : rendezvous_(rendezvous), rank_(rank), seq_(seq) {}

  Status Arrive(HostKind kind, const Call* call) {
    HVDC_RETURN_IF_ERROR(rendezvous_->Arrive(rank_, seq_, static_cast<int>(kind), call,
                                             HostKindName(static_cast<int>(kind)), &slot_));
    Status same = rendezvous_->CheckSameKind(*slot_, seq_, HostKindName);
    if (!same.ok()) return Finish(std::move(same));
    return Status::OK();
  }
  const Call& peer(int r) const { return *static_cast<const Call*>(slot_->args[r]); }
  int world_rank(int r) const { return rendezvous_->world_rank(r); }
  uint64_t seq() const { return seq_; }
  void Sync() { rendezvous_->Sync(slot_.get()); }
  void Leave() { rendezvous_->Release(seq_, slot_.get()); }
  Status Finish(Status s) {
    Sync();
    Leave();
    return s;
  }

 private:
  Rendezvous* rendezvous_;
  const int rank_;
  const uint64_t seq_;
  std::shared_ptr<RendezvousSlot> slot_;
};

}  // namespace

LocalHostComm::LocalHostComm(std::shared_ptr<Rendezvous> rendezvous, int rank)
    : rendezvous_(std::move(rendezvous)), rank_(rank), size_(rendezvous_->size()) {}

Status LocalHostComm::Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                ReduceOp op) {
  if (size_ == 1) {
    if (count < 0) return Status::InvalidArgument("Allreduce: negative count");
    HVDC_RETURN_IF_ERROR(CheckReduce("Allreduce", dtype, op));
    if (count > 0 && send != recv) {
      std::memmove(recv, send, static_cast<size_t>(count) * DataTypeSize(dtype));
    }
    return Status::OK();
  }
  // Rank b reduces elements [count*b/n, count*(b+1)/n) of every input into its own block; then
  // every rank copies all blocks out. Nothing writes recv until every input has been read, so
  // send == recv (in place) is safe.
  const bool valid = count >= 0 && ValidReduce(dtype, op);
  const int64_t esize = valid ? static_cast<int64_t>(DataTypeSize(dtype)) : 0;
  auto lo = [&](int b) { return count * b / size_; };
  std::vector<uint8_t> block(valid ? static_cast<size_t>((lo(rank_ + 1) - lo(rank_)) * esize) : 0);
  Call call;
  call.send = static_cast<const uint8_t*>(send);
  call.recv = static_cast<uint8_t*>(recv);
  call.count = count;
  call.dtype = dtype;
  call.op = op;
  call.block = block.data();
  Meeting m(rendezvous_.get(), rank_, next_seq_++);
  HVDC_RETURN_IF_ERROR(m.Arrive(HostKind::kAllreduce, &call));

  // Validated in the same order on every rank, so every rank reaches the same verdict.
  for (int r = 0; r < size_; ++r) {
    const Call& c = m.peer(r);
    if (c.count < 0) {
      return m.Finish(Status::InvalidArgument(
          fmt::format("Allreduce: rank {} passed a negative count {}", m.world_rank(r), c.count)));
    }
    Status s = CheckReduce("Allreduce", c.dtype, c.op);
    if (!s.ok()) return m.Finish(s);
  }
  for (int r = 1; r < size_; ++r) {
    const Call& a = m.peer(0);
    const Call& c = m.peer(r);
    if (c.count != a.count || c.dtype != a.dtype || c.op != a.op) {
      return m.Finish(Status::PreconditionError(
          fmt::format("Allreduce #{}: rank {} passed {} x {} ({}) but rank {} passed {} x {} ({})",
                      m.seq(), m.world_rank(0), a.count, DataTypeName(a.dtype), ReduceOpName(a.op),
                      m.world_rank(r), c.count, DataTypeName(c.dtype), ReduceOpName(c.op))));
    }
  }

  const int64_t n = lo(rank_ + 1) - lo(rank_);
  if (n > 0) {
    const int64_t offset = lo(rank_) * esize;
    Copy(block.data(), m.peer(0).send + offset, n * esize);
    for (int r = 1; r < size_; ++r) {
      cpu::ReduceInto(block.data(), m.peer(r).send + offset, n, dtype, op);
    }
  }
  m.Sync();
  for (int b = 0; b < size_; ++b) {
    Copy(call.recv + lo(b) * esize, m.peer(b).block, (lo(b + 1) - lo(b)) * esize);
  }
  return m.Finish(Status::OK());
}

Status LocalHostComm::Allgatherv(const void* send, int64_t send_bytes, void* recv,
                                 const std::vector<int64_t>& recv_bytes) {
  if (size_ == 1) {
    if (send_bytes < 0) return Status::InvalidArgument("Allgatherv: negative send_bytes");
    HVDC_RETURN_IF_ERROR(CheckSizes("Allgatherv", "recv_bytes", recv_bytes, 1));
    if (recv_bytes[0] != send_bytes) {
      return Status::PreconditionError(fmt::format(
          "Allgatherv: recv_bytes[0] = {} but send_bytes = {}", recv_bytes[0], send_bytes));
    }
    if (send_bytes > 0 && send != recv) std::memmove(recv, send, static_cast<size_t>(send_bytes));
    return Status::OK();
  }
  Call call;
  call.send = static_cast<const uint8_t*>(send);
  call.recv = static_cast<uint8_t*>(recv);
  call.count = send_bytes;
  call.sizes = &recv_bytes;
  // Peers read our send while we write our recv: fine if send is exactly our own block of recv (in
  // place), otherwise an overlapping send is first copied aside.
  std::vector<uint8_t> aside;
  bool in_place = false;
  if (send_bytes >= 0 && SizesOk(recv_bytes, size_)) {
    const int64_t total = Prefix(recv_bytes, size_);
    in_place = call.send == call.recv + Prefix(recv_bytes, rank_);
    if (!in_place && Overlap(send, send_bytes, recv, total)) {
      aside.assign(call.send, call.send + send_bytes);
      call.send = aside.data();
    }
  }
  Meeting m(rendezvous_.get(), rank_, next_seq_++);
  HVDC_RETURN_IF_ERROR(m.Arrive(HostKind::kAllgatherv, &call));

  for (int r = 0; r < size_; ++r) {
    const Call& c = m.peer(r);
    if (c.count < 0) {
      return m.Finish(Status::InvalidArgument(fmt::format(
          "Allgatherv: rank {} passed a negative send_bytes {}", m.world_rank(r), c.count)));
    }
    Status s = CheckSizes("Allgatherv", "recv_bytes", *c.sizes, size_);
    if (!s.ok()) return m.Finish(s);
  }
  for (int r = 0; r < size_; ++r) {
    for (int j = 0; j < size_; ++j) {
      if ((*m.peer(r).sizes)[j] != m.peer(j).count) {
        return m.Finish(Status::PreconditionError(fmt::format(
            "Allgatherv #{}: rank {} expects {} bytes from rank {}, which sends {}", m.seq(),
            m.world_rank(r), (*m.peer(r).sizes)[j], m.world_rank(j), m.peer(j).count)));
      }
    }
  }
  int64_t offset = 0;
  for (int j = 0; j < size_; ++j) {
    if (!(j == rank_ && in_place)) Copy(call.recv + offset, m.peer(j).send, recv_bytes[j]);
    offset += recv_bytes[j];
  }
  return m.Finish(Status::OK());
}

Status LocalHostComm::Broadcast(void* buf, int64_t bytes, int root) {
  if (size_ == 1) {
    if (bytes < 0) return Status::InvalidArgument("Broadcast: negative byte count");
    if (root != 0) {
      return Status::InvalidArgument(fmt::format("Broadcast: root {} outside a set of 1", root));
    }
    return Status::OK();
  }
  Call call;
  call.recv = static_cast<uint8_t*>(buf);
  call.count = bytes;
  call.root = root;
  Meeting m(rendezvous_.get(), rank_, next_seq_++);
  HVDC_RETURN_IF_ERROR(m.Arrive(HostKind::kBroadcast, &call));

  for (int r = 0; r < size_; ++r) {
    const Call& c = m.peer(r);
    if (c.count < 0 || c.root < 0 || c.root >= size_) {
      return m.Finish(Status::InvalidArgument(
          fmt::format("Broadcast: rank {} passed {} bytes from root {} (set of {})",
                      m.world_rank(r), c.count, c.root, size_)));
    }
  }
  for (int r = 1; r < size_; ++r) {
    const Call& a = m.peer(0);
    const Call& c = m.peer(r);
    if (c.count != a.count || c.root != a.root) {
      return m.Finish(Status::PreconditionError(fmt::format(
          "Broadcast #{}: rank {} passed {} bytes from root {} but rank {} passed {} from root {}",
          m.seq(), m.world_rank(0), a.count, a.root, m.world_rank(r), c.count, c.root)));
    }
  }
  if (rank_ != root) Copy(call.recv, m.peer(root).recv, bytes);
  return m.Finish(Status::OK());
}

Status LocalHostComm::Alltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                void* recv, const std::vector<int64_t>& recv_bytes) {
  if (size_ == 1) {
    HVDC_RETURN_IF_ERROR(CheckSizes("Alltoallv", "send_bytes", send_bytes, 1));
    HVDC_RETURN_IF_ERROR(CheckSizes("Alltoallv", "recv_bytes", recv_bytes, 1));
    if (send_bytes[0] != recv_bytes[0]) {
      return Status::PreconditionError(fmt::format(
          "Alltoallv: send_bytes[0] = {} but recv_bytes[0] = {}", send_bytes[0], recv_bytes[0]));
    }
    if (send_bytes[0] > 0 && send != recv) {
      std::memmove(recv, send, static_cast<size_t>(send_bytes[0]));
    }
    return Status::OK();
  }
  Call call;
  call.send = static_cast<const uint8_t*>(send);
  call.recv = static_cast<uint8_t*>(recv);
  call.send_sizes = &send_bytes;
  call.sizes = &recv_bytes;
  std::vector<uint8_t> aside;  // peers read our send while we write our recv
  if (SizesOk(send_bytes, size_) && SizesOk(recv_bytes, size_)) {
    const int64_t send_total = Prefix(send_bytes, size_);
    if (Overlap(send, send_total, recv, Prefix(recv_bytes, size_))) {
      aside.assign(call.send, call.send + send_total);
      call.send = aside.data();
    }
  }
  Meeting m(rendezvous_.get(), rank_, next_seq_++);
  HVDC_RETURN_IF_ERROR(m.Arrive(HostKind::kAlltoallv, &call));

  for (int r = 0; r < size_; ++r) {
    Status s = CheckSizes("Alltoallv", "send_bytes", *m.peer(r).send_sizes, size_);
    if (s.ok()) s = CheckSizes("Alltoallv", "recv_bytes", *m.peer(r).sizes, size_);
    if (!s.ok()) return m.Finish(s);
  }
  for (int r = 0; r < size_; ++r) {
    for (int j = 0; j < size_; ++j) {
      const int64_t sent = (*m.peer(r).send_sizes)[j], expected = (*m.peer(j).sizes)[r];
      if (sent != expected) {
        return m.Finish(Status::PreconditionError(
            fmt::format("Alltoallv #{}: rank {} sends {} bytes to rank {}, which expects {}",
                        m.seq(), m.world_rank(r), sent, m.world_rank(j), expected)));
      }
    }
  }
  int64_t offset = 0;
  for (int j = 0; j < size_; ++j) {
    const Call& c = m.peer(j);
    Copy(call.recv + offset, c.send + Prefix(*c.send_sizes, rank_), recv_bytes[j]);
    offset += recv_bytes[j];
  }
  return m.Finish(Status::OK());
}

Status LocalHostComm::ReduceScatter(const void* send, void* recv,
                                    const std::vector<int64_t>& recv_counts, DataType dtype,
                                    ReduceOp op) {
  if (size_ == 1) {
    HVDC_RETURN_IF_ERROR(CheckSizes("ReduceScatter", "recv_counts", recv_counts, 1));
    HVDC_RETURN_IF_ERROR(CheckReduce("ReduceScatter", dtype, op));
    if (recv_counts[0] > 0 && send != recv) {
      std::memmove(recv, send, static_cast<size_t>(recv_counts[0]) * DataTypeSize(dtype));
    }
    return Status::OK();
  }
  Call call;
  call.send = static_cast<const uint8_t*>(send);
  call.recv = static_cast<uint8_t*>(recv);
  call.dtype = dtype;
  call.op = op;
  call.sizes = &recv_counts;
  Meeting m(rendezvous_.get(), rank_, next_seq_++);
  HVDC_RETURN_IF_ERROR(m.Arrive(HostKind::kReduceScatter, &call));

  for (int r = 0; r < size_; ++r) {
    const Call& c = m.peer(r);
    Status s = CheckSizes("ReduceScatter", "recv_counts", *c.sizes, size_);
    if (s.ok()) s = CheckReduce("ReduceScatter", c.dtype, c.op);
    if (!s.ok()) return m.Finish(s);
  }
  for (int r = 1; r < size_; ++r) {
    const Call& a = m.peer(0);
    const Call& c = m.peer(r);
    if (*c.sizes != *a.sizes || c.dtype != a.dtype || c.op != a.op) {
      return m.Finish(Status::PreconditionError(
          fmt::format("ReduceScatter #{}: ranks {} and {} disagree on recv_counts, dtype or "
                      "reduce op ({}/{} vs {}/{})",
                      m.seq(), m.world_rank(0), m.world_rank(r), DataTypeName(a.dtype),
                      ReduceOpName(a.op), DataTypeName(c.dtype), ReduceOpName(c.op))));
    }
  }
  const int64_t esize = static_cast<int64_t>(DataTypeSize(dtype));
  const int64_t n = recv_counts[rank_];
  const int64_t offset = Prefix(recv_counts, rank_) * esize;
  // Peers may still be reading our send: if recv overlaps it, reduce aside and copy after a Sync.
  std::vector<uint8_t> aside;
  uint8_t* dst = call.recv;
  if (Overlap(send, Prefix(recv_counts, size_) * esize, recv, n * esize)) {
    aside.resize(static_cast<size_t>(n * esize));
    dst = aside.data();
  }
  if (n > 0) {
    Copy(dst, m.peer(0).send + offset, n * esize);
    for (int r = 1; r < size_; ++r) cpu::ReduceInto(dst, m.peer(r).send + offset, n, dtype, op);
  }
  m.Sync();  // every peer is done reading our send
  if (dst != call.recv) Copy(call.recv, dst, n * esize);
  m.Leave();
  return Status::OK();
}

Status LocalHostComm::Barrier() {
  if (size_ == 1) return Status::OK();
  Call call;
  Meeting m(rendezvous_.get(), rank_, next_seq_++);
  HVDC_RETURN_IF_ERROR(m.Arrive(HostKind::kBarrier, &call));
  m.Leave();
  return Status::OK();
}

}  // namespace local
}  // namespace hvdc

#include "local_controller/local_host_comm.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "ops/cpu/kernels.h"

namespace hvdc {
namespace local {
namespace {

const char* KindName(int kind) {
  return HostComm::CollectiveName(static_cast<HostComm::Collective>(kind));
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
  const Status* refused = nullptr;  // the arguments failed HostComm's check, with this error
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

// One call's place on the rendezvous. Every path after a successful Arrive ends in Finish() (a last
// Sync, then Release) or, when a Sync has already fenced the last read of peer memory, Leave().
class Meeting {
 public:
  Meeting(Rendezvous* rendezvous, int rank, uint64_t seq)
      : rendezvous_(rendezvous), rank_(rank), seq_(seq) {}

  // Once every member has arrived: an error, the same on every member, when they did not all
  // make the same call or one's arguments failed HostComm's check.
  Status Arrive(HostComm::Collective kind, const Call* call) {
    HVDC_RETURN_IF_ERROR(rendezvous_->Arrive(rank_, seq_, static_cast<int>(kind), call,
                                             HostComm::CollectiveName(kind), &slot_));
    Status same = rendezvous_->CheckSameKind(*slot_, seq_, KindName);
    if (!same.ok()) return Finish(std::move(same));
    // A barrier has no arguments to refuse, and its members leave without a Sync: a peer's Call
    // may be gone already, so it is not read.
    if (kind == HostComm::Collective::kBarrier) return Status::OK();
    for (int r = 0; r < static_cast<int>(slot_->args.size()); ++r) {
      const Status* refused = peer(r).refused;
      if (refused == nullptr) continue;
      return Finish(r == rank_ ? *refused : refused->WithOrigin(world_rank(r)));
    }
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

Status LocalHostComm::Refuse(Collective c, Status error) {
  if (size_ == 1) return error;
  // Arrive with the error instead of arguments: every member returns it (Meeting::Arrive).
  Call call;
  call.refused = &error;
  Meeting m(rendezvous_.get(), rank_, next_seq_++);
  return m.Arrive(c, &call);
}

Status LocalHostComm::DoAllreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                  ReduceOp op) {
  if (size_ == 1) {
    if (count > 0 && send != recv) {
      std::memmove(recv, send, static_cast<size_t>(count) * DataTypeSize(dtype));
    }
    return Status::OK();
  }
  // Rank b reduces elements [count*b/n, count*(b+1)/n) of every input into its own block; then
  // every rank copies all blocks out. Nothing writes recv until every input has been read, so
  // send == recv (in place) is safe.
  const int64_t esize = static_cast<int64_t>(DataTypeSize(dtype));
  auto lo = [&](int b) { return count * b / size_; };
  std::vector<uint8_t> block(static_cast<size_t>((lo(rank_ + 1) - lo(rank_)) * esize));
  Call call;
  call.send = static_cast<const uint8_t*>(send);
  call.recv = static_cast<uint8_t*>(recv);
  call.count = count;
  call.dtype = dtype;
  call.op = op;
  call.block = block.data();
  Meeting m(rendezvous_.get(), rank_, next_seq_++);
  HVDC_RETURN_IF_ERROR(m.Arrive(Collective::kAllreduce, &call));

  // Compared in the same order on every rank, so every rank reaches the same verdict.
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

Status LocalHostComm::DoAllgatherv(const void* send, int64_t send_bytes, void* recv,
                                   const std::vector<int64_t>& recv_bytes) {
  if (size_ == 1) {
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
  const bool in_place = call.send == call.recv + Prefix(recv_bytes, rank_);
  if (!in_place && Overlap(send, send_bytes, recv, Prefix(recv_bytes, size_))) {
    aside.assign(call.send, call.send + send_bytes);
    call.send = aside.data();
  }
  Meeting m(rendezvous_.get(), rank_, next_seq_++);
  HVDC_RETURN_IF_ERROR(m.Arrive(Collective::kAllgatherv, &call));

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

Status LocalHostComm::DoBroadcast(void* buf, int64_t bytes, int root) {
  if (size_ == 1) return Status::OK();
  Call call;
  call.recv = static_cast<uint8_t*>(buf);
  call.count = bytes;
  call.root = root;
  Meeting m(rendezvous_.get(), rank_, next_seq_++);
  HVDC_RETURN_IF_ERROR(m.Arrive(Collective::kBroadcast, &call));

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

Status LocalHostComm::DoAlltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                  void* recv, const std::vector<int64_t>& recv_bytes) {
  if (size_ == 1) {
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
  const int64_t send_total = Prefix(send_bytes, size_);
  if (Overlap(send, send_total, recv, Prefix(recv_bytes, size_))) {
    aside.assign(call.send, call.send + send_total);
    call.send = aside.data();
  }
  Meeting m(rendezvous_.get(), rank_, next_seq_++);
  HVDC_RETURN_IF_ERROR(m.Arrive(Collective::kAlltoallv, &call));

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

Status LocalHostComm::DoReduceScatter(const void* send, void* recv,
                                      const std::vector<int64_t>& recv_counts, DataType dtype,
                                      ReduceOp op) {
  if (size_ == 1) {
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
  HVDC_RETURN_IF_ERROR(m.Arrive(Collective::kReduceScatter, &call));

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

Status LocalHostComm::DoBarrier() {
  if (size_ == 1) return Status::OK();
  Call call;
  Meeting m(rendezvous_.get(), rank_, next_seq_++);
  HVDC_RETURN_IF_ERROR(m.Arrive(Collective::kBarrier, &call));
  m.Leave();
  return Status::OK();
}

}  // namespace local
}  // namespace hvdc

// ShmHostComm's rounds, descriptions, liveness checks, Barrier and Refuse; the data-moving
// collectives are in shm_collectives.cc.
#include "shm_controller/shm_host_comm.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>

#include "shm_controller/peer_process.h"
#include "shm_controller/shm_wait.h"

namespace hvdc {
namespace shm {

ShmHostComm::ShmHostComm(std::unique_ptr<Segment> segment, int rank, std::vector<int> world_ranks,
                         double peer_timeout_s)
    : segment_(std::move(segment)),
      header_(segment_->header()),
      lines_(reinterpret_cast<RankLine*>(segment_->base() + kLine)),
      rank_(rank),
      size_(static_cast<int>(world_ranks.size())),
      world_ranks_(std::move(world_ranks)),
      peer_timeout_s_(peer_timeout_s),
      desc_bytes_(static_cast<int64_t>(header_->desc_bytes)),
      slot_bytes_(static_cast<int64_t>(header_->slot_bytes)),
      stopped_(static_cast<size_t>(size_)) {
  __atomic_store_n(&lines_[rank_].pid, static_cast<int32_t>(getpid()), __ATOMIC_RELEASE);
}

ShmHostComm::~ShmHostComm() = default;

uint8_t* ShmHostComm::Half(int q) const {
  const int64_t half = desc_bytes_ + slot_bytes_;
  const int64_t index = 2 * static_cast<int64_t>(q) + static_cast<int64_t>(round_ % 2);
  return segment_->base() + kLine * (1 + size_) + index * half;
}

int64_t* ShmHostComm::DescVector(int q, int which) const {
  return reinterpret_cast<int64_t*>(Half(q) + sizeof(OpDesc)) + which * size_;
}

Status ShmHostComm::AbortedStatus() const {
  const int32_t v = __atomic_load_n(&header_->aborted, __ATOMIC_ACQUIRE);
  return Status::PeerLost(fmt::format(
      "shared-memory data plane: rank {} was lost (stopped or exited); the plane is closed",
      v > 0 && v <= size_ ? world_ranks_[v - 1] : -1));
}

Status ShmHostComm::Abort(int lost, Status why) {
  int32_t expected = 0;
  __atomic_compare_exchange_n(&header_->aborted, &expected, lost + 1, false, __ATOMIC_ACQ_REL,
                              __ATOMIC_ACQUIRE);
  for (int q = 0; q < size_; ++q) WakeAll(&lines_[q]);
  return why;
}

Status ShmHostComm::CheckPeer(int q) {
  if (__atomic_load_n(&header_->aborted, __ATOMIC_ACQUIRE) != 0) return AbortedStatus();
  const int32_t pid = __atomic_load_n(&lines_[q].pid, __ATOMIC_ACQUIRE);
  if (pid <= 0 || pid == getpid()) return Status::OK();  // not attached yet, or a thread of ours
  const ProcessLiveness liveness = LivenessOf(pid);
  if (liveness == ProcessLiveness::kExited) {
    return Abort(
        q, Status::PeerLost(fmt::format("shared-memory data plane: rank {} (pid {}) has exited",
                                        world_ranks_[q], pid)));
  }
  if (stopped_[q].StoppedTooLong(liveness, MonotonicNs(), peer_timeout_s_)) {
    return Abort(q, Status::PeerLost(fmt::format(
                        "shared-memory data plane: rank {} (pid {}) has been stopped for more "
                        "than {} s",
                        world_ranks_[q], pid, peer_timeout_s_)));
  }
  return Status::OK();
}

Status ShmHostComm::BeginRound() {
  if (__atomic_load_n(&header_->aborted, __ATOMIC_ACQUIRE) != 0) return AbortedStatus();
  if (round_ > 0) HVDC_RETURN_IF_ERROR(WaitAll(-1));
  std::memset(Desc(rank_), 0, sizeof(OpDesc));
  return Status::OK();
}

void ShmHostComm::PublishPhase(int phase) { Publish(&lines_[rank_], Target(phase)); }

Status ShmHostComm::WaitAll(int phase) {
  const uint32_t target = Target(phase);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    HVDC_RETURN_IF_ERROR(WaitReached(&lines_[q], target, [this, q] { return CheckPeer(q); }));
  }
  return Status::OK();
}

Status ShmHostComm::CheckDescs(Collective c, int vectors) const {
  const char* name = CollectiveName(c);
  for (int q = 0; q < size_; ++q) {
    if (Desc(q)->refused != 0) {
      return Status::InvalidArgument(
                 fmt::format("{}: rank {} refused its arguments", name, world_ranks_[q]))
          .WithOrigin(world_ranks_[q]);
    }
  }
  const OpDesc& a = *Desc(0);
  for (int q = 1; q < size_; ++q) {
    const OpDesc& d = *Desc(q);
    if (d.kind != a.kind) {
      return Status::PreconditionError(
          fmt::format("{}: rank {} called {} but rank {} called {}", name, world_ranks_[0],
                      CollectiveName(static_cast<Collective>(a.kind)), world_ranks_[q],
                      CollectiveName(static_cast<Collective>(d.kind))));
    }
    bool same = d.dtype == a.dtype && d.op == a.op && d.count == a.count && d.root == a.root;
    for (int v = 0; v < vectors && same; ++v) {
      same = std::memcmp(DescVector(q, v), DescVector(0, v), sizeof(int64_t) * size_) == 0;
    }
    if (!same) {
      return Status::PreconditionError(fmt::format(
          "{}: ranks {} and {} disagree on the call ({} x {} {} root {} vs {} x {} {} root {}, or "
          "the per-rank sizes)",
          name, world_ranks_[0], world_ranks_[q], a.count,
          DataTypeName(static_cast<DataType>(a.dtype)), ReduceOpName(static_cast<ReduceOp>(a.op)),
          a.root, d.count, DataTypeName(static_cast<DataType>(d.dtype)),
          ReduceOpName(static_cast<ReduceOp>(d.op)), d.root));
    }
  }
  return Status::OK();
}

Status ShmHostComm::DoBarrier() {
  if (size_ == 1) return Status::OK();
  HVDC_RETURN_IF_ERROR(BeginRound());
  Desc(rank_)->kind = static_cast<int32_t>(Collective::kBarrier);
  PublishPhase(2);
  HVDC_RETURN_IF_ERROR(WaitAll(1));
  Status s = CheckDescs(Collective::kBarrier, 0);
  EndRound();
  return s;
}

Status ShmHostComm::Refuse(Collective c, Status error) {
  if (size_ == 1) return error;
  HVDC_RETURN_IF_ERROR(BeginRound());
  Desc(rank_)->kind = static_cast<int32_t>(c);
  Desc(rank_)->refused = 1;
  PublishPhase(2);
  Status met = WaitAll(1);
  EndRound();
  return met.ok() ? error : met;
}

}  // namespace shm
}  // namespace hvdc

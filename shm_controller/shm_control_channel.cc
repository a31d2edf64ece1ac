#include "shm_controller/shm_control_channel.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "shm_controller/shm_wait.h"

namespace hvdc {
namespace shm {
namespace {

enum class Kind : int32_t { kBitAnd = 1, kGather = 2, kBroadcast = 3 };

const char* KindName(int32_t kind) {
  switch (static_cast<Kind>(kind)) {
    case Kind::kBitAnd:
      return "BitAnd";
    case Kind::kGather:
      return "Gather";
    case Kind::kBroadcast:
      return "Broadcast";
  }
  return "an unknown operation";
}

// At the start of each half; the payload's chunk follows at desc_bytes.
struct ControlDesc {
  int32_t kind;
  int32_t unused;
  int64_t length;  // the whole payload's length in bytes (0 for a rank that sends nothing)
};
static_assert(sizeof(ControlDesc) <= sizeof(OpDesc), "fits in the description area");

}  // namespace

// One operation: rounds of exchange until every payload has gone through (see the header).
class ExchangeOp : public PendingOp {
 public:
  ExchangeOp(ShmControlChannel* channel, Kind kind, std::string payload, bool sends)
      : ch_(channel),
        kind_(kind),
        payload_(std::move(payload)),
        sends_(sends),
        lengths_(static_cast<size_t>(channel->size_), 0),
        received_(static_cast<size_t>(channel->size_)) {
    Write();
  }

  std::vector<uint64_t>* bits = nullptr;
  std::vector<std::string>* gathered = nullptr;
  std::string* blob = nullptr;

  bool Test(Status* status) override {
    while (!finished_) {
      if (!ArrivedAll()) {
        const int64_t now = MonotonicNs();
        if (next_check_ns_ == 0) next_check_ns_ = now + ShmControlChannel::kLivenessEveryNs;
        if (now < next_check_ns_) return false;
        next_check_ns_ = now + ShmControlChannel::kLivenessEveryNs;
        Status lost = ch_->CheckMissing(target_);
        if (lost.ok()) return false;
        Finish(lost);
        break;
      }
      Status s = Read();
      ++rounds_done_;
      if (!s.ok()) {
        Finish(s);
      } else if (rounds_done_ >= rounds_) {
        Finish(Combine());
      } else {
        Write();
      }
    }
    *status = status_;
    return true;
  }

  bool Missing(std::vector<int>* ranks) const override {
    ranks->clear();
    for (int q = 0; q < ch_->size_ && !finished_; ++q) {
      if (q != ch_->rank_ && !Reached(Counter(q), target_)) ranks->push_back(q);
    }
    return true;
  }

 private:
  uint32_t Counter(int q) const {
    return __atomic_load_n(&ch_->Line(q)->counter, __ATOMIC_ACQUIRE);
  }

  bool ArrivedAll() const {
    for (int q = 0; q < ch_->size_; ++q) {
      if (q != ch_->rank_ && !Reached(Counter(q), target_)) return false;
    }
    return true;
  }

  // The bytes of a payload of `length` that round `round` carries.
  int64_t ChunkAt(int64_t length, int64_t round) const {
    const int64_t offset = round * ch_->chunk_bytes_;
    return std::clamp<int64_t>(length - offset, 0, ch_->chunk_bytes_);
  }

  // Begins this rank's next round: its description and chunk into its half, then published.
  void Write() {
    uint8_t* half = ch_->Half(ch_->rank_, ch_->round_);
    auto* d = reinterpret_cast<ControlDesc*>(half);
    d->kind = static_cast<int32_t>(kind_);
    d->length = sends_ ? static_cast<int64_t>(payload_.size()) : 0;
    const int64_t n = ChunkAt(d->length, rounds_done_);
    if (n > 0) {
      std::memcpy(half + ch_->desc_bytes_, payload_.data() + rounds_done_ * ch_->chunk_bytes_,
                  static_cast<size_t>(n));
    }
    ++ch_->round_;
    target_ = static_cast<uint32_t>(ch_->round_);
    Publish(ch_->Line(ch_->rank_), target_);
  }

  bool Keeps(int q) const {
    if (q == ch_->rank_) return false;  // its own payload is at hand
    switch (kind_) {
      case Kind::kBitAnd:
        return true;
      case Kind::kGather:
        return ch_->rank_ == 0;
      case Kind::kBroadcast:
        return q == 0;
    }
    return false;
  }

  // Every rank has written the round that just ended: check the descriptions, keep the chunks.
  Status Read() {
    const uint64_t round = ch_->round_ - 1;
    for (int q = 0; q < ch_->size_; ++q) {
      const uint8_t* half = ch_->Half(q, round);
      const auto* d = reinterpret_cast<const ControlDesc*>(half);
      if (d->kind != static_cast<int32_t>(kind_)) {
        return Status::PreconditionError(
            fmt::format("shared-memory control channel: rank {} is in {} while rank {} is in {}",
                        ch_->world_ranks_[q], KindName(d->kind), ch_->world_ranks_[ch_->rank_],
                        KindName(static_cast<int32_t>(kind_))));
      }
      if (rounds_done_ == 0) lengths_[q] = d->length;
      if (!Keeps(q)) continue;
      const int64_t n = ChunkAt(lengths_[q], rounds_done_);
      received_[q].append(reinterpret_cast<const char*>(half + ch_->desc_bytes_),
                          static_cast<size_t>(n));
    }
    if (rounds_done_ == 0) {
      const int64_t longest = *std::max_element(lengths_.begin(), lengths_.end());
      rounds_ = std::max<int64_t>(1, (longest + ch_->chunk_bytes_ - 1) / ch_->chunk_bytes_);
    }
    return Status::OK();
  }

  Status Combine() {
    const int me = ch_->rank_;
    switch (kind_) {
      case Kind::kBitAnd:
        for (int q = 0; q < ch_->size_; ++q) {
          if (lengths_[q] != lengths_[me]) {
            return Status::PreconditionError(fmt::format(
                "BitAnd: rank {} passed {} words where rank {} passed {}", ch_->world_ranks_[q],
                lengths_[q] / 8, ch_->world_ranks_[me], lengths_[me] / 8));
          }
        }
        for (int q = 0; q < ch_->size_; ++q) {
          if (q == me) continue;
          for (size_t w = 0; w < bits->size(); ++w) {
            uint64_t v;
            std::memcpy(&v, received_[q].data() + w * sizeof(v), sizeof(v));
            (*bits)[w] &= v;
          }
        }
        break;
      case Kind::kGather:
        gathered->clear();
        if (me == 0) {
          received_[0] = std::move(payload_);
          *gathered = std::move(received_);
        }
        break;
      case Kind::kBroadcast:
        if (me != 0) *blob = std::move(received_[0]);
        break;
    }
    return Status::OK();
  }

  void Finish(Status s) {
    status_ = std::move(s);
    finished_ = true;
  }

  ShmControlChannel* const ch_;
  const Kind kind_;
  std::string payload_;
  const bool sends_;
  std::vector<int64_t> lengths_;       // [q]: rank q's payload length, from the first round
  std::vector<std::string> received_;  // [q]: what has arrived of rank q's payload (if kept)
  int64_t rounds_ = 1;                 // rounds this operation takes (known after the first)
  int64_t rounds_done_ = 0;
  uint32_t target_ = 0;  // the counter every peer must reach for the current round
  int64_t next_check_ns_ = 0;
  bool finished_ = false;
  Status status_;
};

ShmControlChannel::ShmControlChannel(std::unique_ptr<Segment> segment, int rank,
                                     std::vector<int> world_ranks, double peer_timeout_s,
                                     double defer_s)
    : segment_(std::move(segment)),
      lines_(reinterpret_cast<RankLine*>(segment_->base() + kLine)),
      rank_(rank),
      size_(static_cast<int>(world_ranks.size())),
      world_ranks_(std::move(world_ranks)),
      peer_timeout_s_(peer_timeout_s),
      defer_s_(defer_s),
      desc_bytes_(static_cast<int64_t>(segment_->header()->desc_bytes)),
      chunk_bytes_(static_cast<int64_t>(segment_->header()->slot_bytes)),
      stopped_(static_cast<size_t>(size_)),
      exited_since_ns_(static_cast<size_t>(size_), 0) {
  __atomic_store_n(&lines_[rank_].pid, static_cast<int32_t>(getpid()), __ATOMIC_RELEASE);
}

ShmControlChannel::~ShmControlChannel() = default;

int64_t ShmControlChannel::SegmentBytes(int nranks, int64_t chunk) {
  return kLine * (1 + nranks) + 2 * static_cast<int64_t>(nranks) * (DescBytes(nranks) + chunk);
}

uint8_t* ShmControlChannel::Half(int q, uint64_t round) const {
  const int64_t half = desc_bytes_ + chunk_bytes_;
  const int64_t index = 2 * static_cast<int64_t>(q) + static_cast<int64_t>(round % 2);
  return segment_->base() + kLine * (1 + size_) + index * half;
}

Status ShmControlChannel::CheckMissing(uint32_t target) {
  for (int q = 0; q < size_ && broken_.ok(); ++q) {
    if (q == rank_ || Reached(__atomic_load_n(&lines_[q].counter, __ATOMIC_ACQUIRE), target)) {
      continue;
    }
    const int32_t pid = __atomic_load_n(&lines_[q].pid, __ATOMIC_ACQUIRE);
    if (pid <= 0 || pid == getpid()) continue;  // not attached yet, or a thread of ours
    const ProcessLiveness liveness = LivenessOf(pid);
    const int64_t now = MonotonicNs();
    if (liveness == ProcessLiveness::kExited) {
      if (exited_since_ns_[q] == 0) exited_since_ns_[q] = now;
      if (now - exited_since_ns_[q] < static_cast<int64_t>(defer_s_ * 1e9)) continue;
      broken_ = Status::PeerLost(fmt::format(
          "shared-memory control channel: rank {} (pid {}) has exited", world_ranks_[q], pid));
    } else if (stopped_[q].StoppedTooLong(liveness, now, peer_timeout_s_ + defer_s_)) {
      broken_ = Status::PeerLost(
          fmt::format("shared-memory control channel: rank {} (pid {}) has been stopped for more "
                      "than {} s",
                      world_ranks_[q], pid, peer_timeout_s_ + defer_s_));
    }
  }
  return broken_;
}

std::unique_ptr<PendingOp> ShmControlChannel::StartBitAnd(std::vector<uint64_t>* bits) {
  if (!broken_.ok()) return std::make_unique<DoneOp>(broken_);
  if (size_ == 1) return std::make_unique<DoneOp>();
  std::string words(reinterpret_cast<const char*>(bits->data()), bits->size() * sizeof(uint64_t));
  auto op = std::make_unique<ExchangeOp>(this, Kind::kBitAnd, std::move(words), true);
  op->bits = bits;
  return op;
}

std::unique_ptr<PendingOp> ShmControlChannel::StartGather(std::string send,
                                                          std::vector<std::string>* gathered) {
  if (!broken_.ok()) return std::make_unique<DoneOp>(broken_);
  if (size_ == 1) {
    gathered->assign(1, std::move(send));
    return std::make_unique<DoneOp>();
  }
  auto op = std::make_unique<ExchangeOp>(this, Kind::kGather, std::move(send), true);
  op->gathered = gathered;
  return op;
}

std::unique_ptr<PendingOp> ShmControlChannel::StartBroadcast(std::string* blob) {
  if (!broken_.ok()) return std::make_unique<DoneOp>(broken_);
  if (size_ == 1) return std::make_unique<DoneOp>();
  // Only rank 0's blob travels; the others' are replaced when it arrives.
  auto op =
      std::make_unique<ExchangeOp>(this, Kind::kBroadcast, rank_ == 0 ? *blob : "", rank_ == 0);
  op->blob = blob;
  return op;
}

}  // namespace shm
}  // namespace hvdc

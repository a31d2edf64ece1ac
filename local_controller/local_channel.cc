#include "local_controller/local_channel.h"

#include <fmt/format.h>

#include <utility>

namespace hvdc {
namespace local {
namespace {

const char* KindName(ControlKind kind) {
  switch (kind) {
    case ControlKind::kBitAnd:
      return "BitAnd";
    case ControlKind::kGather:
      return "Gather";
    case ControlKind::kBroadcast:
      return "Broadcast";
  }
  return "?";
}

class LocalPendingOp : public PendingOp {
 public:
  LocalPendingOp(std::shared_ptr<ControlBoard> board, uint64_t seq, int rank,
                 std::vector<uint64_t>* bits, std::vector<std::string>* gathered, std::string* blob)
      : board_(std::move(board)),
        seq_(seq),
        rank_(rank),
        bits_(bits),
        gathered_(gathered),
        blob_(blob) {}
  ~LocalPendingOp() override {
    if (!done_) board_->Abandon(seq_);
  }

  bool Test(Status* status) override {
    if (!done_) done_ = board_->TryFinish(seq_, rank_, bits_, gathered_, blob_, &status_);
    if (done_) *status = status_;
    return done_;
  }
  bool Missing(std::vector<int>* ranks) const override {
    *ranks = board_->Missing(seq_, rank_);
    return true;
  }

 private:
  std::shared_ptr<ControlBoard> board_;
  const uint64_t seq_;
  const int rank_;
  std::vector<uint64_t>* bits_;
  std::vector<std::string>* gathered_;
  std::string* blob_;
  bool done_ = false;
  Status status_;
};

}  // namespace

void ControlBoard::Deposit(uint64_t seq, int rank, ControlKind kind,
                           const std::vector<uint64_t>* bits, std::string* blob) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = slots_[seq];
  if (slot.by.empty()) slot.by.resize(size_);
  slot.by[rank] = true;
  const bool first = slot.deposited++ == 0;
  if (first) {
    slot.kind = kind;
  } else if (slot.kind != kind) {
    if (slot.error.empty()) {
      slot.error = fmt::format(
          "local control operation #{}: ranks disagree on the operation ({} and {}, the latter "
          "from rank {})",
          seq, KindName(slot.kind), KindName(kind), rank);
    }
    return;
  }
  switch (kind) {
    case ControlKind::kBitAnd:
      if (first) {
        slot.bits = *bits;
      } else if (slot.bits.size() != bits->size()) {
        if (slot.error.empty()) {
          slot.error = fmt::format(
              "local BitAnd #{}: ranks passed bit vectors of different lengths ({} and {} words, "
              "the latter from rank {})",
              seq, slot.bits.size(), bits->size(), rank);
        }
      } else {
        for (size_t i = 0; i < bits->size(); ++i) slot.bits[i] &= (*bits)[i];
      }
      break;
    case ControlKind::kGather:
      if (slot.blobs.empty()) slot.blobs.resize(size_);
      slot.blobs[rank] = std::move(*blob);
      break;
    case ControlKind::kBroadcast:
      if (rank == 0) {
        slot.root_blob = *blob;
        slot.root_deposited = true;
      }
      break;
  }
}

bool ControlBoard::TryFinish(uint64_t seq, int rank, std::vector<uint64_t>* bits,
                             std::vector<std::string>* gathered, std::string* blob,
                             Status* status) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(seq);
  if (it == slots_.end()) {
    *status = Status::UnknownError(fmt::format("local control operation #{} not found", seq));
    return true;
  }
  Slot& slot = it->second;
  if (!slot.error.empty()) {
    *status = Status::PreconditionError(slot.error);
    FinishLocked(seq, &slot);
    return true;
  }
  switch (slot.kind) {
    case ControlKind::kBitAnd:
      if (slot.deposited < size_) return false;
      *bits = slot.bits;
      break;
    case ControlKind::kGather:
      if (rank == 0) {
        if (slot.deposited < size_) return false;
        *gathered = std::move(slot.blobs);
      }
      break;
    case ControlKind::kBroadcast:
      if (rank != 0) {
        if (!slot.root_deposited) return false;
        *blob = slot.root_blob;
      }
      break;
  }
  *status = Status::OK();
  FinishLocked(seq, &slot);
  return true;
}

std::vector<int> ControlBoard::Missing(uint64_t seq, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> missing;
  auto it = slots_.find(seq);
  if (it == slots_.end()) return missing;
  const Slot& slot = it->second;
  if (slot.kind == ControlKind::kBroadcast) {
    if (rank != 0 && !slot.root_deposited) missing.push_back(0);
  } else if (slot.kind == ControlKind::kBitAnd || rank == 0) {
    for (int r = 0; r < size_; ++r) {
      if (!slot.by[r]) missing.push_back(r);
    }
  }
  return missing;
}

void ControlBoard::Abandon(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(seq);
  if (it != slots_.end()) FinishLocked(seq, &it->second);
}

void ControlBoard::FinishLocked(uint64_t seq, Slot* slot) {
  // Every rank deposits before it can finish, so once all have finished nobody touches the slot.
  if (++slot->finished == size_) slots_.erase(seq);
}

size_t ControlBoard::slots_in_use() {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.size();
}

LocalControlChannel::LocalControlChannel(std::shared_ptr<ControlBoard> board, int rank)
    : board_(std::move(board)), rank_(rank), size_(board_->size()) {}

std::unique_ptr<PendingOp> LocalControlChannel::StartBitAnd(std::vector<uint64_t>* bits) {
  if (size_ == 1) return std::make_unique<DoneOp>();
  const uint64_t seq = next_seq_++;
  board_->Deposit(seq, rank_, ControlKind::kBitAnd, bits, nullptr);
  return std::make_unique<LocalPendingOp>(board_, seq, rank_, bits, nullptr, nullptr);
}

std::unique_ptr<PendingOp> LocalControlChannel::StartGather(std::string send,
                                                            std::vector<std::string>* gathered) {
  gathered->clear();
  if (size_ == 1) {
    gathered->push_back(std::move(send));
    return std::make_unique<DoneOp>();
  }
  const uint64_t seq = next_seq_++;
  board_->Deposit(seq, rank_, ControlKind::kGather, nullptr, &send);
  return std::make_unique<LocalPendingOp>(board_, seq, rank_, nullptr, gathered, nullptr);
}

std::unique_ptr<PendingOp> LocalControlChannel::StartBroadcast(std::string* blob) {
  if (size_ == 1) return std::make_unique<DoneOp>();
  const uint64_t seq = next_seq_++;
  board_->Deposit(seq, rank_, ControlKind::kBroadcast, nullptr, blob);
  return std::make_unique<LocalPendingOp>(board_, seq, rank_, nullptr, nullptr, blob);
}

}  // namespace local
}  // namespace hvdc

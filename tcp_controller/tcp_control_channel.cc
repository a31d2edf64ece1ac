#include "tcp_controller/tcp_control_channel.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>

namespace hvdc {
namespace tcp {
namespace {

// Waits (without blocking) for one message from each of `from`; Take() consumes each.
class ReceiveOp : public PendingOp {
 public:
  ReceiveOp(Group* group, std::vector<int> from) : group_(group), from_(std::move(from)) {}

  // Takes the messages in whatever order they arrive (Take() does not depend on it), so Missing()
  // can name every rank still owing one.
  bool Test(Status* status) override {
    for (size_t i = 0; !done_ && i < from_.size(); ++i) {
      if (received_[i]) continue;
      std::string message;
      Status s;
      if (!group_->TryRecvMessage(from_[i], &message, &s)) continue;
      received_[i] = true;
      ++count_;
      if (s.ok()) s = Take(from_[i], std::move(message));
      if (!s.ok()) {
        status_ = s;
        done_ = true;
      }
    }
    if (!done_ && count_ < from_.size()) return false;
    if (!done_) {
      status_ = Finish();
      done_ = true;
    }
    *status = status_;
    return true;
  }
  bool Missing(std::vector<int>* ranks) const override {
    ranks->clear();
    for (size_t i = 0; i < from_.size(); ++i) {
      if (!received_[i]) ranks->push_back(from_[i]);
    }
    return true;
  }

 protected:
  virtual Status Take(int from, std::string message) = 0;
  virtual Status Finish() { return Status::OK(); }

  Group* group_;

 private:
  const std::vector<int> from_;
  std::vector<bool> received_ = std::vector<bool>(from_.size());
  size_t count_ = 0;
  bool done_ = false;
  Status status_;
};

class BitAndOp : public ReceiveOp {
 public:
  BitAndOp(Group* group, std::vector<int> from, std::vector<uint64_t>* bits)
      : ReceiveOp(group, std::move(from)), bits_(bits), acc_(*bits) {}

 private:
  Status Take(int from, std::string message) override {
    if (message.size() != acc_.size() * sizeof(uint64_t)) {
      return Status::PreconditionError(
          fmt::format("BitAnd: rank {} passed {} words where this rank passed {}",
                      group_->world_rank(from), message.size() / sizeof(uint64_t), acc_.size()));
    }
    for (size_t i = 0; i < acc_.size(); ++i) {
      uint64_t w;
      std::memcpy(&w, message.data() + i * sizeof(uint64_t), sizeof(w));
      acc_[i] &= w;
    }
    return Status::OK();
  }
  Status Finish() override {
    *bits_ = acc_;
    return Status::OK();
  }

  std::vector<uint64_t>* bits_;
  std::vector<uint64_t> acc_;
};

class GatherOp : public ReceiveOp {
 public:
  GatherOp(Group* group, std::vector<int> from, std::string own, std::vector<std::string>* gathered)
      : ReceiveOp(group, std::move(from)), gathered_(gathered) {
    blobs_.resize(group->size());
    blobs_[0] = std::move(own);
  }

 private:
  Status Take(int from, std::string message) override {
    blobs_[from] = std::move(message);
    return Status::OK();
  }
  Status Finish() override {
    *gathered_ = std::move(blobs_);
    return Status::OK();
  }

  std::vector<std::string>* gathered_;
  std::vector<std::string> blobs_;
};

class BroadcastOp : public ReceiveOp {
 public:
  BroadcastOp(Group* group, std::string* blob) : ReceiveOp(group, {0}), blob_(blob) {}

 private:
  Status Take(int, std::string message) override {
    *blob_ = std::move(message);
    return Status::OK();
  }
  std::string* blob_;
};

std::vector<int> OthersThan(int rank, int size) {
  std::vector<int> v;
  for (int r = 0; r < size; ++r) {
    if (r != rank) v.push_back(r);
  }
  return v;
}

}  // namespace

std::unique_ptr<PendingOp> TcpControlChannel::StartBitAnd(std::vector<uint64_t>* bits) {
  if (size() == 1) return std::make_unique<DoneOp>();
  const std::string words(reinterpret_cast<const char*>(bits->data()),
                          bits->size() * sizeof(uint64_t));
  for (int r : OthersThan(rank(), size())) {
    Status s = group_.SendMessage(r, words);
    if (!s.ok()) return std::make_unique<DoneOp>(s);
  }
  return std::make_unique<BitAndOp>(&group_, OthersThan(rank(), size()), bits);
}

std::unique_ptr<PendingOp> TcpControlChannel::StartGather(std::string send,
                                                          std::vector<std::string>* gathered) {
  gathered->clear();
  if (size() == 1) {
    gathered->push_back(std::move(send));
    return std::make_unique<DoneOp>();
  }
  if (rank() != 0) return std::make_unique<DoneOp>(group_.SendMessage(0, send));
  return std::make_unique<GatherOp>(&group_, OthersThan(0, size()), std::move(send), gathered);
}

std::unique_ptr<PendingOp> TcpControlChannel::StartBroadcast(std::string* blob) {
  if (size() == 1) return std::make_unique<DoneOp>();
  if (rank() == 0) {
    for (int r = 1; r < size(); ++r) {
      Status s = group_.SendMessage(r, *blob);
      if (!s.ok()) return std::make_unique<DoneOp>(s);
    }
    return std::make_unique<DoneOp>();
  }
  return std::make_unique<BroadcastOp>(&group_, blob);
}

}  // namespace tcp
}  // namespace hvdc

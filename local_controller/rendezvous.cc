#include "local_controller/rendezvous.h"

#include <fmt/format.h>

#include <utility>

namespace hvdc {
namespace local {

Rendezvous::Rendezvous(std::vector<int> world_ranks, Clock::duration arrival_timeout)
    : world_ranks_(std::move(world_ranks)),
      size_(static_cast<int>(world_ranks_.size())),
      arrival_timeout_(arrival_timeout) {}

Status Rendezvous::Arrive(int rank, uint64_t seq, int kind, const void* args, const char* what,
                          std::shared_ptr<RendezvousSlot>* out) {
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<RendezvousSlot>& entry = slots_[seq];
  if (!entry) entry = std::make_shared<RendezvousSlot>(size_);
  std::shared_ptr<RendezvousSlot> slot = entry;
  if (slot->abandoned) return Status::UnknownError(slot->abandon_message);
  slot->args[rank] = args;
  slot->kinds[rank] = kind;
  slot->present[rank] = true;
  if (++slot->arrived == size_) {
    cv_.notify_all();
    *out = std::move(slot);
    return Status::OK();
  }
  const Clock::time_point deadline = Clock::now() + arrival_timeout_;
  cv_.wait_until(lock, deadline, [&] { return slot->arrived == size_ || slot->abandoned; });
  if (slot->arrived == size_) {
    *out = std::move(slot);
    return Status::OK();
  }
  if (!slot->abandoned) {
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (slot->present[r]) continue;
      if (!missing.empty()) missing += ", ";
      missing += std::to_string(world_ranks_[r]);
    }
    slot->abandoned = true;
    slot->abandon_message = fmt::format(
        "local {} #{}: gave up after waiting {:g} s for the other ranks: rank(s) {} did not arrive",
        what, seq, std::chrono::duration<double>(arrival_timeout_).count(), missing);
    cv_.notify_all();
  }
  // Withdraw, so the call can never complete with this rank's (soon stale) arguments.
  slot->args[rank] = nullptr;
  slot->present[rank] = false;
  --slot->arrived;
  return Status::UnknownError(slot->abandon_message);
}

void Rendezvous::Sync(RendezvousSlot* slot) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t generation = slot->sync_generation;
  if (++slot->sync_count == size_) {
    slot->sync_count = 0;
    ++slot->sync_generation;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return slot->sync_generation != generation; });
}

void Rendezvous::Release(uint64_t seq, RendezvousSlot* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (++slot->released == size_) slots_.erase(seq);
}

std::shared_ptr<void> Rendezvous::Product(RendezvousSlot* slot,
                                          const std::function<std::shared_ptr<void>()>& make) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!slot->product) slot->product = make();
  return slot->product;
}

size_t Rendezvous::slots_in_use() {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.size();
}

Status Rendezvous::CheckSameKind(const RendezvousSlot& slot, uint64_t seq,
                                 const char* (*kind_name)(int)) const {
  for (size_t r = 1; r < slot.kinds.size(); ++r) {
    if (slot.kinds[r] != slot.kinds[0]) {
      return Status::PreconditionError(
          fmt::format("local collective #{}: ranks disagree on the operation: rank {} called {}, "
                      "rank {} called {}",
                      seq, world_ranks_[0], kind_name(slot.kinds[0]), world_ranks_[r],
                      kind_name(slot.kinds[r])));
    }
  }
  return Status::OK();
}

}  // namespace local
}  // namespace hvdc

#include "core/tensor_queue.h"

#include <string_view>
#include <unordered_set>

namespace hvdc {

Status TensorQueue::CheckNames(const std::vector<std::shared_ptr<TensorEntry>>& entries) const {
  if (closed_) return closed_status_;
  // A group's own names: pairwise for a few, a set for many (a grouped op may carry thousands).
  constexpr size_t kPairwise = 16;
  std::unordered_set<HashedName, HashedNameHash> seen;
  if (entries.size() > kPairwise) seen.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string& name = entries[i]->request.name;
    bool dup_in_group = false;
    if (entries.size() > kPairwise) {
      dup_in_group = !seen.insert(HashedName{name, entries[i]->name_hash}).second;
    } else {
      for (size_t j = 0; j < i; ++j) dup_in_group |= entries[j]->request.name == name;
    }
    if (dup_in_group || in_flight_.Contains(HashedName{name, entries[i]->name_hash})) {
      return Status::InvalidArgument(
          "Requested to collective-process tensor '" + name +
          "', but a tensor with the same name is already in flight (names must be unique among "
          "tensors not yet completed)");
    }
  }
  return Status::OK();
}

Status TensorQueue::PushFrom(std::vector<std::shared_ptr<TensorEntry>>* entries) {
  for (auto& e : *entries) e->hashed_name();  // outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  HVDC_RETURN_IF_ERROR(CheckNames(*entries));
  for (auto& e : *entries) {
    in_flight_.Insert(e);
    incoming_.push_back(std::move(e));
  }
  entries->clear();
  return Status::OK();
}

Status TensorQueue::Claim(const std::vector<std::shared_ptr<TensorEntry>>& entries) {
  for (auto& e : entries) e->hashed_name();
  std::lock_guard<std::mutex> lock(mu_);
  HVDC_RETURN_IF_ERROR(CheckNames(entries));
  for (auto& e : entries) in_flight_.Insert(e);
  return Status::OK();
}

std::vector<std::shared_ptr<TensorEntry>> TensorQueue::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::move(incoming_);
}

void TensorQueue::DrainInto(std::vector<std::shared_ptr<TensorEntry>>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  incoming_.swap(*out);
}

size_t TensorQueue::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return incoming_.size();
}

void TensorQueue::Release(std::string_view name) {
  const HashedName key = Hashed(name);
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_.Erase(key);
}

void TensorQueue::Release(const std::vector<BatchItem>& items) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const BatchItem& item : items) {
    if (item.entry) in_flight_.Erase(item.entry->hashed_name());
  }
}

void TensorQueue::Close(Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  closed_status_ = std::move(status);
}

}  // namespace hvdc

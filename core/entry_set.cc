#include "core/entry_set.h"

#include <utility>

namespace hvdc {

uint32_t EntrySet::Find(HashedName key) const {
  return index_.Find(key.name, key.hash, [this](uint32_t slot) -> const std::string& {
    return slots_[slot]->request.name;
  });
}

bool EntrySet::Insert(std::shared_ptr<TensorEntry> entry) {
  const HashedName key = entry->hashed_name();
  if (Find(key) != NameIndex::kNone) return false;
  uint32_t slot;
  if (free_.empty()) {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.push_back(std::move(entry));
  } else {
    slot = free_.back();
    free_.pop_back();
    slots_[slot] = std::move(entry);
  }
  index_.Insert(key.hash, slot);
  return true;
}

bool EntrySet::Erase(HashedName key) {
  const uint32_t slot = Find(key);
  if (slot == NameIndex::kNone) return false;
  index_.Erase(key.hash, slot);
  slots_[slot].reset();
  free_.push_back(slot);
  return true;
}

}  // namespace hvdc

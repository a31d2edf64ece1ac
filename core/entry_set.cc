#include "core/entry_set.h"

#include <utility>

namespace hvdc {

uint32_t EntrySet::Position(HashedName key) const {
  return index_.Find(key.name, key.hash, [this](uint32_t pos) -> const std::string& {
    return entries_[pos]->request.name;
  });
}

TensorEntry* EntrySet::Find(HashedName key) const {
  const uint32_t pos = Position(key);
  return pos == NameIndex::kNone ? nullptr : entries_[pos].get();
}

bool EntrySet::Insert(std::shared_ptr<TensorEntry> entry) {
  const HashedName key = entry->hashed_name();
  if (Position(key) != NameIndex::kNone) return false;
  index_.Insert(key.hash, static_cast<uint32_t>(entries_.size()));
  entries_.push_back(std::move(entry));
  return true;
}

void EntrySet::Put(std::shared_ptr<TensorEntry> entry) {
  const uint32_t pos = Position(entry->hashed_name());
  if (pos == NameIndex::kNone) {
    Insert(std::move(entry));
  } else {
    entries_[pos] = std::move(entry);  // the same name: the index stays as it is
  }
}

std::shared_ptr<TensorEntry> EntrySet::Take(HashedName key) {
  const uint32_t pos = Position(key);
  if (pos == NameIndex::kNone) return nullptr;
  index_.Erase(key.hash, pos);
  std::shared_ptr<TensorEntry> taken = std::move(entries_[pos]);
  const uint32_t last = static_cast<uint32_t>(entries_.size() - 1);
  if (pos != last) {  // the last entry fills the gap
    const uint64_t hash = entries_[last]->name_hash;
    index_.Erase(hash, last);
    index_.Insert(hash, pos);
    entries_[pos] = std::move(entries_[last]);
  }
  entries_.pop_back();
  return taken;
}

std::vector<std::shared_ptr<TensorEntry>> EntrySet::TakeAll() {
  index_ = NameIndex();
  return std::exchange(entries_, {});
}

}  // namespace hvdc

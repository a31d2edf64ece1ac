// EntrySet: tensor entries by name -- the queue's in-flight names, the negotiator's pending
// tensors. The entries sit in one dense array (an erase moves the last one into the gap) and are
// found through a NameIndex of their positions: no allocation per tensor once the arrays have
// grown to a step's size (a node map allocates and frees a node for every tensor), and a walk
// over the entries costs their number, not the most the set ever held.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/name_index.h"
#include "core/tensor_entry.h"

namespace hvdc {

class EntrySet {
 public:
  // The entry of this name, or null.
  TensorEntry* Find(HashedName key) const;
  bool Contains(HashedName key) const { return Position(key) != NameIndex::kNone; }
  // Adds `entry` under its name (entry->hashed_name()); false, and nothing added, if an entry of
  // that name is in already.
  bool Insert(std::shared_ptr<TensorEntry> entry);
  // Adds `entry`, replacing an entry of the same name if there is one.
  void Put(std::shared_ptr<TensorEntry> entry);
  // Removes the entry of this name and returns it (null if there is none).
  std::shared_ptr<TensorEntry> Take(HashedName key);
  bool Erase(HashedName key) { return Take(key) != nullptr; }
  // Every entry (in no particular order), and all of them taken out.
  const std::vector<std::shared_ptr<TensorEntry>>& entries() const { return entries_; }
  std::vector<std::shared_ptr<TensorEntry>> TakeAll();
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

 private:
  uint32_t Position(HashedName key) const;

  NameIndex index_;  // name -> position in entries_
  std::vector<std::shared_ptr<TensorEntry>> entries_;
};

}  // namespace hvdc

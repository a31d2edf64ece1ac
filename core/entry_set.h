// EntrySet: tensor entries by name, for the queue's in-flight names. The names are found through a
// NameIndex over slot numbers, and the entries sit in a slot array whose freed slots are reused: no
// allocation per tensor once the arrays have grown to a step's size (a node map allocates and
// frees a node for every tensor, on the enqueuing thread and on the executor).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/name_index.h"
#include "core/tensor_entry.h"

namespace hvdc {

class EntrySet {
 public:
  bool Contains(HashedName key) const { return Find(key) != NameIndex::kNone; }
  // Adds `entry` under its name (entry->hashed_name()); false, and nothing added, if an entry of
  // that name is in already.
  bool Insert(std::shared_ptr<TensorEntry> entry);
  // Removes the entry of this name; false if there is none.
  bool Erase(HashedName key);
  size_t size() const { return index_.size(); }

 private:
  uint32_t Find(HashedName key) const;

  NameIndex index_;                                  // name -> slot
  std::vector<std::shared_ptr<TensorEntry>> slots_;  // null: free
  std::vector<uint32_t> free_;                       // free slots
};

}  // namespace hvdc

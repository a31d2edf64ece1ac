#include "core/name_index.h"

#include <functional>
#include <utility>

namespace hvdc {

uint64_t NameIndex::Hash(std::string_view name) { return std::hash<std::string_view>()(name); }

void NameIndex::Insert(uint64_t hash, uint32_t bit) {
  if (2 * (size_ + 1) > slots_.size()) Grow();
  size_t i = hash & mask();
  while (slots_[i].bit != kNone) i = (i + 1) & mask();
  slots_[i] = Slot{hash, bit};
  ++size_;
}

bool NameIndex::Erase(uint64_t hash, uint32_t bit) {
  if (slots_.empty()) return false;
  size_t hole = hash & mask();
  for (;; hole = (hole + 1) & mask()) {
    if (slots_[hole].bit == kNone) return false;
    if (slots_[hole].bit == bit) break;
  }
  // Close the hole: a later pair of the same run moves back into it unless its home lies
  // (cyclically) after the hole, where a lookup starting at that home would not pass the hole.
  for (size_t j = (hole + 1) & mask(); slots_[j].bit != kNone; j = (j + 1) & mask()) {
    const size_t home = slots_[j].hash & mask();
    const size_t from_home = (j - home) & mask();
    const size_t from_hole = (j - hole) & mask();
    if (from_home >= from_hole) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole] = Slot{};
  --size_;
  return true;
}

void NameIndex::Grow() {
  std::vector<Slot> old =
      std::exchange(slots_, std::vector<Slot>(slots_.empty() ? 16 : 2 * slots_.size()));
  size_ = 0;
  for (const Slot& s : old) {
    if (s.bit != kNone) Insert(s.hash, s.bit);
  }
}

}  // namespace hvdc

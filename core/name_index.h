// NameIndex: the response cache's name -> bit map. Open addressing with linear probing over
// (hash, bit) pairs in one array: a lookup reads one or two neighbouring pairs and then the name
// itself, which stays where the cache keeps it (the caller says where: `name_of(bit)`). A
// node-based map costs a bucket, a node and the node's key on every lookup, each likely a cache
// miss once a step's tensors have passed through the fusion buffer.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace hvdc {

class NameIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  static uint64_t Hash(std::string_view name);

  // The bit indexed under `name` (whose Hash is `hash`), or kNone.
  template <typename NameOf>
  uint32_t Find(std::string_view name, uint64_t hash, const NameOf& name_of) const {
    if (slots_.empty()) return kNone;
    for (size_t i = hash & mask();; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (s.bit == kNone) return kNone;
      if (s.hash == hash && name_of(s.bit) == name) return s.bit;
    }
  }
  // Indexes `bit` under a name with this hash; the name must not be indexed yet.
  void Insert(uint64_t hash, uint32_t bit);
  // Removes `bit`, indexed with this hash; false if it was not indexed.
  bool Erase(uint64_t hash, uint32_t bit);
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t bit = kNone;
  };
  size_t mask() const { return slots_.size() - 1; }
  void Grow();

  std::vector<Slot> slots_;  // a power of two, at most half full
  size_t size_ = 0;
};

// A name with its NameIndex::Hash, the key of the per-tensor maps (the queue's in-flight names,
// the negotiator's pending tensors): a tensor's name is hashed once, not at every lookup.
struct HashedName {
  std::string_view name;
  uint64_t hash;
  bool operator==(const HashedName& o) const { return hash == o.hash && name == o.name; }
};
struct HashedNameHash {
  size_t operator()(const HashedName& k) const { return static_cast<size_t>(k.hash); }
};
inline HashedName Hashed(std::string_view name) { return {name, NameIndex::Hash(name)}; }

}  // namespace hvdc

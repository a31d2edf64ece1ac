#include "core/response_cache.h"

#include <algorithm>
#include <functional>

namespace hvdc {

uint64_t ResponseCache::EntryHash(uint32_t bit, uint64_t name_hash) {
  // XOR of per-entry hashes: order independent, updated in O(1) on put and erase.
  return (name_hash ^ (0x9e3779b97f4a7c15ULL * (bit + 1))) * 0xff51afd7ed558ccdULL;
}

uint32_t ResponseCache::FindBit(const std::string& name, uint64_t name_hash) const {
  return index_.Find(name, name_hash,
                     [this](uint32_t b) -> const std::string& { return slots_[b].response->name; });
}

ResponseCache::Lookup ResponseCache::Find(const Request& q, uint64_t name_hash, int set_rank,
                                          uint32_t* bit) const {
  const uint32_t found = FindBit(q.name, name_hash);
  if (found == NameIndex::kNone) return Lookup::kMiss;
  const Response& p = *slots_[found].response;
  // Device kind only: with one GPU per rank the ordinals differ across ranks.
  bool same = p.op == q.op && p.dtype == q.dtype && (p.device < 0) == (q.device < 0) &&
              p.reduce_op == q.reduce_op && p.prescale == q.prescale &&
              p.postscale == q.postscale && p.group_size == q.group_size && p.group == q.group;
  if (same) {
    switch (q.op) {
      case OpType::kAllgather:
        same = set_rank < static_cast<int>(p.first_dims.size()) && !q.shape.empty() &&
               p.first_dims[set_rank] == q.shape[0] && p.shape.size() == q.shape.size() &&
               std::equal(q.shape.begin() + 1, q.shape.end(), p.shape.begin() + 1);
        break;
      case OpType::kBroadcast:
        same = p.shape == q.shape && p.root_rank == q.root_rank;
        break;
      default:
        same = p.shape == q.shape;
    }
  }
  *bit = found;
  return same ? Lookup::kHit : Lookup::kMismatch;
}

void ResponseCache::Put(SharedResponse shared) {
  const Response& response = *shared;
  if (capacity_ <= 0 || response.error_code != StatusCode::kOk) return;
  if (response.op == OpType::kJoin || response.op == OpType::kAlltoall) return;
  const uint64_t name_hash = NameIndex::Hash(response.name);
  const uint32_t existing = FindBit(response.name, name_hash);
  if (existing != NameIndex::kNone) Erase(existing);
  if (evicted_.count(response.name) && capacity_ < max_capacity_) {
    capacity_ = std::min(capacity_ * 2, max_capacity_);
    evicted_.clear();
  }
  uint32_t bit;
  if (static_cast<int64_t>(index_.size()) >= capacity_) {
    bit = lru_.back();
    if (capacity_ < max_capacity_) {
      // A cycle of n tensors brings a name back n - capacity evictions later: remember up to
      // max_capacity_ names, enough for every cycle the cache may grow to hold.
      if (static_cast<int64_t>(evicted_.size()) >= max_capacity_) evicted_.clear();
      evicted_.insert(slots_[bit].response->name);
    }
    Erase(bit);
  } else {
    bit = first_free_;
    while (bit < slots_.size() && slots_[bit].used) ++bit;
  }
  if (bit >= slots_.size()) slots_.resize(bit + 1);
  Slot& slot = slots_[bit];
  slot.used = true;
  slot.name_hash = name_hash;
  slot.response = std::move(shared);
  if (bit == first_free_) first_free_ = bit + 1;
  lru_.push_front(bit);
  slot.lru = lru_.begin();
  index_.Insert(name_hash, bit);
  hash_ ^= EntryHash(bit, name_hash);
  ++version_;
}

void ResponseCache::Touch(uint32_t bit) {
  if (!Has(bit)) return;
  lru_.splice(lru_.begin(), lru_, slots_[bit].lru);
}

void ResponseCache::Erase(uint32_t bit) {
  if (!Has(bit)) return;
  Slot& slot = slots_[bit];
  hash_ ^= EntryHash(bit, slot.name_hash);
  ++version_;
  index_.Erase(slot.name_hash, bit);
  lru_.erase(slot.lru);
  slot.used = false;
  slot.response.reset();
  first_free_ = std::min(first_free_, bit);
}

}  // namespace hvdc

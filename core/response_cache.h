// ResponseCache: negotiated tensors get a small integer id (a bit) so that steady-state readiness
// is one bitwise AND over ranks instead of a gather. Every rank holds an identical copy: it changes
// only while processing the ordered responses of a round (same inputs, same order, same result),
// and the negotiator verifies that with a hash exchanged in every round.
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/batch.h"
#include "core/message.h"
#include "core/name_index.h"

namespace hvdc {

// Capacity: HOROVOD_CACHE_CAPACITY is where it starts (0 turns caching off). Least recently used
// entries make room for new ones -- but a model with more tensors than the cache submits them in
// the same cycle every step, and LRU over a cycle longer than the cache misses every time. So the
// cache remembers the names it evicted for lack of room; when one of them comes back, the working
// set is larger than the cache and the capacity doubles (up to kMaxCapacity). Every rank sees the
// same puts in the same order, so every copy grows at the same round.
class ResponseCache {
 public:
  static constexpr int64_t kMaxCapacity = 16384;

  explicit ResponseCache(int64_t capacity)
      : capacity_(capacity), max_capacity_(std::max(capacity, kMaxCapacity)) {}

  enum class Lookup { kMiss, kHit, kMismatch };
  // kHit: `request` (from this set rank) matches the cached response for its name; kMismatch: the
  // name is cached with other parameters (the entry must be invalidated everywhere).
  Lookup Find(const Request& request, int set_rank, uint32_t* bit) const {
    return Find(request, NameIndex::Hash(request.name), set_rank, bit);
  }
  // The same with the name's NameIndex::Hash already known.
  Lookup Find(const Request& request, uint64_t name_hash, int set_rank, uint32_t* bit) const;
  // Caches a successful response (replacing the least recently used one when full, or growing).
  void Put(SharedResponse response);
  void Put(const Response& response) { Put(std::make_shared<const Response>(response)); }
  const Response& Get(uint32_t bit) const { return *slots_[bit].response; }
  // The cached response itself, for batch items (valid while Has(bit)).
  const SharedResponse& Shared(uint32_t bit) const { return slots_[bit].response; }
  uint64_t NameHash(uint32_t bit) const { return slots_[bit].name_hash; }
  bool Has(uint32_t bit) const { return bit < slots_.size() && slots_[bit].used; }
  void Touch(uint32_t bit);
  void Erase(uint32_t bit);

  int64_t capacity() const { return capacity_; }
  size_t words() const { return (static_cast<size_t>(capacity_) + 63) / 64; }
  // Changes whenever the contents change; equal on every rank when the copies agree.
  uint64_t hash() const { return hash_; }
  // Changes whenever a name gains or loses a bit (never 0); equal versions, same lookups.
  uint64_t version() const { return version_; }

 private:
  struct Slot {
    bool used = false;
    uint64_t name_hash = 0;  // NameIndex::Hash(response.name)
    SharedResponse response;
    std::list<uint32_t>::iterator lru;
  };
  static uint64_t EntryHash(uint32_t bit, uint64_t name_hash);
  uint32_t FindBit(const std::string& name, uint64_t name_hash) const;

  int64_t capacity_;
  int64_t max_capacity_;
  std::vector<Slot> slots_;
  std::unordered_set<std::string> evicted_;  // evicted for room since the last growth
  NameIndex index_;                          // name -> bit of the used slots
  std::list<uint32_t> lru_;                  // front = most recently used
  // Every slot below it is used: a put takes the lowest free bit without walking the used ones
  // (a first step of n new tensors walked n^2 / 2 slots).
  uint32_t first_free_ = 0;
  uint64_t hash_ = 0;
  uint64_t version_ = 1;
};

}  // namespace hvdc

// TensorEntry: one enqueued tensor, from hvdc_enqueue until its callback has run.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "core/message.h"
#include "core/name_index.h"
#include "core/status.h"

namespace hvdc {

// Runs the user's callback once, after the last member of a group completes, with the first error.
class Completion {
 public:
  using Callback = std::function<void(const Status&)>;
  Completion(int members, Callback cb) : remaining_(members), callback_(std::move(cb)) {}
  void MemberDone(const Status& s) {
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (first_error_.ok()) first_error_ = s;
    }
    // The last member's decrement orders after every other member's (and so after any error
    // they stored): it reads first_error_ without the lock.
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) callback_(first_error_);
  }

 private:
  std::atomic<int> remaining_;
  Callback callback_;
  std::mutex mu_;  // orders the members' writes to first_error_
  Status first_error_;
};

using Allocator = std::function<void*(const Shape& shape)>;

// One tensor as its caller hands it over: what to negotiate and where its data lives. The C API
// fills it once from hvdc_request (root_rank is still a global rank then), and it travels as it
// is, moved, into the queue's entry.
struct EnqueueItem {
  Request request;
  const void* input = nullptr;
  void* output = nullptr;  // allreduce/broadcast: caller's buffer; others: set by Allocate()
  Allocator allocate;      // allgather, alltoall, reducescatter
  int32_t* received_splits = nullptr;
  int32_t* join_last_rank = nullptr;
  // CUDA tensors: the producer's event to wait for, the consumer's stream to release early (see
  // hvdc_request); null when unused.
  const void* ready_event = nullptr;  // cudaEvent_t
  void* done_stream = nullptr;        // cudaStream_t
};

// The caller's request (its fields read as the entry's own) and the runtime's bookkeeping.
struct TensorEntry : EnqueueItem {
  int32_t process_set_id = 0;
  // Runs the callback (MemberDone). A lone tensor's lives in the entry's own allocation; a
  // group's members point to their shared `group_completion`. See NewEntry.
  Completion* completion = nullptr;
  std::shared_ptr<Completion> group_completion;
  std::chrono::steady_clock::time_point enqueued_at;
  // NameIndex::Hash(request.name); 0 until the queue (or the negotiator) computes it. Recomputing
  // gives the same value, so a hash that happens to be 0 costs only a second computation.
  uint64_t name_hash = 0;
  HashedName hashed_name() {
    if (name_hash == 0) name_hash = NameIndex::Hash(request.name);
    return {request.name, name_hash};
  }

  // Set by the control thread.
  bool sent_full = false;  // the coordinator holds this tensor's full request
  bool is_cached = false;  // negotiated through the cache bit `cache_bit`
  uint32_t cache_bit = 0;
  uint64_t cache_version = 0;  // the cache's version() at the lookup
};

namespace detail {
struct LoneEntry {  // an entry and its completion in one allocation
  explicit LoneEntry(Completion::Callback done) : completion(1, std::move(done)) {
    entry.completion = &completion;
  }
  TensorEntry entry;
  Completion completion;
};
}  // namespace detail

// A tensor enqueued alone: `done` runs once it completes.
inline std::shared_ptr<TensorEntry> NewEntry(Completion::Callback done) {
  auto block = std::make_shared<detail::LoneEntry>(std::move(done));
  return std::shared_ptr<TensorEntry>(block, &block->entry);
}

// A member of a group: `group` runs its callback after the last member completes.
inline std::shared_ptr<TensorEntry> NewEntry(std::shared_ptr<Completion> group) {
  auto e = std::make_shared<TensorEntry>();
  e->completion = group.get();
  e->group_completion = std::move(group);
  return e;
}

}  // namespace hvdc

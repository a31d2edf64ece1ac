// TensorQueue: the hand-off from user threads (hvdc_enqueue) to the control thread, per process
// set. It also owns the set of in-flight names, so a second tensor with the same name is rejected
// at enqueue while the first has not completed.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/batch.h"
#include "core/entry_set.h"
#include "core/name_index.h"
#include "core/status.h"
#include "core/tensor_entry.h"

namespace hvdc {

class TensorQueue {
 public:
  // Adds every entry or none (a group is all-or-nothing). Fails on a duplicate in-flight name.
  Status Push(std::vector<std::shared_ptr<TensorEntry>> entries) { return PushFrom(&entries); }
  // Push, moving the entries out of *entries on success; the vector keeps its capacity (an
  // enqueuing thread reuses one).
  Status PushFrom(std::vector<std::shared_ptr<TensorEntry>>* entries);
  // Marks the entries' names in flight without queueing them (a one-member set runs them on the
  // caller's thread); the same checks as Push. Release each name when done.
  Status Claim(const std::vector<std::shared_ptr<TensorEntry>>& entries);
  std::vector<std::shared_ptr<TensorEntry>> Drain();
  // Drain into *out, which must be empty: the two buffers swap, so both keep their capacity.
  void DrainInto(std::vector<std::shared_ptr<TensorEntry>>* out);
  // Entries pushed and not yet drained.
  size_t pending() const;
  // Called once an entry's callback is about to run: its name may be used again.
  void Release(std::string_view name);
  // Release() for every entry of a completed batch, under one lock (items without an entry
  // are skipped).
  void Release(const std::vector<BatchItem>& items);
  // Refuses every later Push with `status` (at shutdown).
  void Close(Status status);

 private:
  mutable std::mutex mu_;  // guards everything below
  std::vector<std::shared_ptr<TensorEntry>> incoming_;
  // In-flight names, read from their entries, which the set keeps alive (until released, or the
  // queue goes): no copy of the name per tensor.
  EntrySet in_flight_;
  Status CheckNames(const std::vector<std::shared_ptr<TensorEntry>>& entries) const;  // mu_ held

  bool closed_ = false;
  Status closed_status_;
};

}  // namespace hvdc

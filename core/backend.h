// Backend: runs batches of one device kind. ops/ registers them (host memory over a HostComm; NCCL
// for device memory when built); the executor picks the first that accepts a batch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/batch.h"
#include "core/config.h"
#include "core/host_comm.h"
#include "core/status.h"

namespace hvdc {

class Timeline;

// A growable, 64-byte aligned scratch buffer; grows to the largest batch actually run.
class FusionBuffer {
 public:
  uint8_t* Reserve(int64_t bytes);
  int64_t capacity() const { return capacity_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;
  int64_t capacity_ = 0;
};

class Backend;

// What a backend keeps for one process set between batches (an NCCL communicator, streams, device
// buffers). Owned by the set's ExecutionContext: destroyed with the set's executor, after its
// thread has stopped -- the destructor must finish or fail whatever is still in flight.
class BackendState {
 public:
  virtual ~BackendState() = default;
};

struct ExecutionContext {
  const Config* config = nullptr;
  HostComm* comm = nullptr;  // the process set's data plane
  FusionBuffer* buffer = nullptr;
  Timeline* timeline = nullptr;  // may be inactive
  // Asynchronous completion, for backends whose work finishes later (on a GPU stream). Such a
  // backend moves every item's `entry` into a Batch of its own and returns OK: the executor then
  // completes nothing (it skips items without an entry). Later, from any thread, the backend calls
  // complete(its_batch, status) exactly once, which completes those items (Executor::Complete).
  // Null when the executor does not offer it: the backend must then finish inside Execute.
  std::function<void(Batch&, const Status&)> complete;
  // Per-backend state for this process set (see BackendState), created by the backend on first
  // use, on the executor thread.
  std::unordered_map<const Backend*, std::unique_ptr<BackendState>> states;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual bool Accepts(const Batch& batch) const = 0;
  // Runs the batch; the executor then completes every item that still holds its entry with the
  // returned status (see ExecutionContext::complete for finishing asynchronously).
  virtual Status Execute(Batch& batch, ExecutionContext& ctx) = 0;
};

}  // namespace hvdc

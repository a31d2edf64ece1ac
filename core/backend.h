// Backend: runs batches of one device kind. ops/ registers them (host memory over a HostComm; NCCL
// for device memory when built); the executor picks the first that accepts a batch.
#pragma once

#include <cstdint>
#include <memory>
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

struct ExecutionContext {
  const Config* config = nullptr;
  HostComm* comm = nullptr;  // the process set's data plane
  FusionBuffer* buffer = nullptr;
  Timeline* timeline = nullptr;  // may be inactive
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual bool Accepts(const Batch& batch) const = 0;
  // Runs the batch; the executor then completes every item with the returned status.
  virtual Status Execute(Batch& batch, ExecutionContext& ctx) = 0;
};

}  // namespace hvdc

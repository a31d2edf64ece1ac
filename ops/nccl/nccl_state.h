// NcclSetState: what the NCCL backend keeps for one process set -- the communicator, a private
// stream, the device fusion buffer -- and the completion thread that waits on CUDA events so the
// executor never waits on the GPU.
//
// Threads: the executor thread calls everything but the destructor's drain; the completion thread
// only waits on events, completes batches, and aborts the communicator when NCCL reports an
// asynchronous error (ncclCommAbort is meant to be called from another thread to unblock it).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/batch.h"
#include "core/host_comm.h"
#include "core/status.h"

namespace hvdc {

class NcclSetState : public BackendState {
 public:
  using CompleteFn = std::function<void(Batch&, const Status&)>;

  // How long queued GPU work may take before the completion thread says so (warn_after_s, 0 =
  // never) and before it aborts the communicator and fails the work (abort_after_s, 0 = never):
  // a member that failed a batch locally, before its collective, leaves the others' collective
  // waiting. From HOROVOD_STALL_CHECK_TIME_SECONDS / HOROVOD_STALL_SHUTDOWN_TIME_SECONDS.
  struct StallLimits {
    double warn_after_s = 0;
    double abort_after_s = 0;
  };

  // Collective over the set (every member calls it while running the same batch): rank 0 makes
  // the NCCL unique id and broadcasts it over `comm`, then every rank joins the communicator on
  // `device`. `complete` null: Finish() waits for the GPU itself.
  static Status Create(HostComm* comm, int device, CompleteFn complete, StallLimits limits,
                       std::unique_ptr<NcclSetState>* out);
  // Lets in-flight work finish (up to a grace period), then aborts the communicator and fails
  // whatever is left, so it never hangs on a dead peer.
  ~NcclSetState() override;

  int device() const { return device_; }
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  // The error that broke the communicator, or OK.
  Status broken() const;

  // Device scratch of at least `bytes`, valid for work queued on stream() from now on (growing it
  // frees the old memory in stream order: no host wait).
  Status Scratch(int64_t bytes, uint8_t** out);

  // Makes stream() wait for the producers' ready events of the batch's tensors (hvdc_request's
  // ready_event) before anything reads their inputs.
  Status WaitForInputs(const Batch& batch);

  // Called once the batch's work is queued on stream() (`queued`: the error that stopped queueing
  // part of it, if any): completes the batch when the GPU has run what was queued, with `queued`
  // or the GPU's error. With asynchronous completion the batch's entries move out of `batch` and
  // the completion thread completes them later (returns OK); else it waits and returns the status.
  // Tensors with a done_stream are completed at once when everything was queued: their stream
  // waits for the batch's event instead of the host.
  Status Finish(Batch& batch, const Status& queued);

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    cudaEvent_t event = nullptr;
    Batch batch;
    Status queued;     // an error while queueing the batch's work
    std::string what;  // "allreduce of 'name' (+N more)", for stall messages
    Clock::time_point queued_at;
  };

  NcclSetState() = default;
  void CompletionLoop();
  // Waits for `event` without blocking forever: polls it, watches NCCL's asynchronous error, the
  // stall limits (counted from `since`) and the shutdown deadline. Aborts the communicator on
  // error, at the stall limit or at the deadline.
  Status Wait(cudaEvent_t event, const std::string& what, Clock::time_point since);
  void Abort(const Status& why);
  Status GetEvent(cudaEvent_t* out);
  void PutEvent(cudaEvent_t event);

  int device_ = -1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  uint8_t* scratch_ = nullptr;
  int64_t scratch_bytes_ = 0;
  CompleteFn complete_;
  StallLimits limits_;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point deadline_{};  // set when stopping
  bool aborted_ = false;
  Status broken_;
  std::thread thread_;
};

}  // namespace hvdc

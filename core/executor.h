// Executor: runs a process set's batches in the agreed order, on its own thread (so negotiation of
// the next batch proceeds while this one runs), and completes each tensor's callback exactly once.
// When MPI cannot run two threads (MPI_THREAD_SERIALIZED), it runs inline on the control thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/batch.h"
#include "core/tensor_queue.h"

namespace hvdc {

class Executor {
 public:
  Executor(int set_id, const Config& config, HostComm* comm, Timeline* timeline,
           const std::vector<Backend*>* backends, TensorQueue* queue, std::function<void()> on_idle,
           bool threaded);
  ~Executor();

  void Submit(std::vector<Batch> batches);
  bool busy() const;
  // Runs everything submitted so far, then stops the thread.
  void Stop();

  // Completes every item of the batch with `status` (exactly once each).
  static void Complete(Batch& batch, const Status& status, TensorQueue* queue);

 private:
  void Loop();
  void Run(Batch& batch);

  const int set_id_;
  ExecutionContext ctx_;
  FusionBuffer buffer_;
  const std::vector<Backend*>* backends_;
  TensorQueue* queue_;
  std::function<void()> on_idle_;

  mutable std::mutex mu_;  // guards batches_, running_, stopping_
  std::condition_variable cv_;
  std::deque<Batch> batches_;
  bool running_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace hvdc

// Executor: runs a process set's batches in the agreed order, on its own thread (so negotiation of
// the next batch proceeds while this one runs), and completes each tensor's callback exactly once.
// When MPI cannot run two threads (MPI_THREAD_SERIALIZED), it runs inline on the control thread.
//
// Lifetime: everything the thread uses while a batch executes (config, fusion buffer, timeline,
// backend list) is owned by a State it shares, so a thread given up on by Abandon() -- stuck in a
// collective with a dead peer -- may outlive the Runtime: when its collective finally returns it
// touches nothing but that State (and the data channel, which the Runtime then leaks unless
// JoinAbandoned() saw the thread return) and exits.
#pragma once

#include <chrono>
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
  Executor(int set_id, const Config& config, HostComm* comm, std::shared_ptr<Timeline> timeline,
           std::vector<Backend*> backends, TensorQueue* queue, std::function<void()> on_idle,
           bool threaded);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The world rank of the set's coordinator: errors it negotiated carry it as their origin. Call
  // before the first Submit.
  void SetCoordinator(int world_rank);

  void Submit(std::vector<Batch> batches);
  bool busy() const;
  // As busy(); when busy, the idle hook runs (once) when the thread next runs out of batches. The
  // control thread asks this when it waits for the executor, so that an executor that nobody
  // waits for goes idle without a wake-up of the control thread per batch.
  bool BusyOrWakeWhenIdle();
  // Runs everything submitted so far, then stops the thread.
  void Stop();
  // Gives up on the thread (it may be stuck for good): every queued batch and the one executing
  // complete now, with `status`, on the caller's thread; callbacks already running finish first.
  // The thread never touches the queue, the idle hook or a callback again.
  void Abandon(const Status& status);
  // After Abandon(): waits up to `limit` for the thread to return (its transport ended what it
  // waited for) and joins it: true, and the data channel is free. Else the thread is detached
  // (still stuck) and false: the caller must leak the channel it uses.
  bool JoinAbandoned(std::chrono::steady_clock::duration limit);

  // Completes every item of the batch with `status` (exactly once each).
  static void Complete(Batch& batch, const Status& status, TensorQueue* queue);

 private:
  struct State;
  static void Loop(std::shared_ptr<State> s);
  static void Run(State& s);
  static Status Execute(State& s, Batch& batch);
  static void Finish(State& s, Batch& batch, const Status& status);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace hvdc

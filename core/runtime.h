// Runtime: the one object that owns everything -- config, transport, process sets (each with its
// queue, negotiator and executor), backends, timeline and the control thread -- and wires them.
// No other globals: tests build several runtimes in one process (threads as ranks).
//
// Its code is split by concern: runtime.cc (start-up, enqueue, timeline), runtime_inline.cc
// (one-member sets run on the caller's thread), runtime_control_loop.cc
// (when each set negotiates, what happens with a round's result), runtime_process_sets.cc (adding,
// removing and querying sets), runtime_shutdown.cc (orderly shutdown, giving up on dead peers). Its
// life is one state, Lifecycle (lifecycle.h: Starting, Running, Draining, Drained, Abandoned,
// Down). The pieces with no Runtime state are units of their own: ProcessSet, ProcessSetTable,
// request_validator.h, execution_order.h.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/config.h"
#include "core/lifecycle.h"
#include "core/process_set_admin.h"
#include "core/process_set_table.h"
#include "core/tensor_entry.h"
#include "core/timeline.h"
#include "core/transport.h"

namespace hvdc {

class Runtime {
 public:
  using Clock = std::chrono::steady_clock;

  static Status Create(Config config, std::unique_ptr<Transport> transport,
                       std::vector<Backend*> backends,
                       const std::vector<std::vector<int>>& extra_sets,
                       std::unique_ptr<Runtime>* out);
  ~Runtime();

  const Topology& topology() const { return transport_->topology(); }
  const Config& config() const { return config_; }
  const Transport& transport() const { return *transport_; }

  // Validates and queues the items (a group when more than one); `done` runs exactly once after
  // the last completes -- unless this returns an error, in which case it never runs. It runs on a
  // runtime thread; with `may_complete_inline`, a one-member set runs the items and `done` on the
  // calling thread, before returning (runtime_inline.cc).
  // The items are consumed (moved from).
  Status Enqueue(int32_t process_set_id, EnqueueItem* items, size_t count,
                 Completion::Callback done, bool may_complete_inline = false);
  Status Enqueue(int32_t process_set_id, std::vector<EnqueueItem> items, Completion::Callback done,
                 bool may_complete_inline = false) {
    return Enqueue(process_set_id, items.data(), items.size(), std::move(done),
                   may_complete_inline);
  }

  // Process sets. An error's detail says why (process_set_error.h); the outputs are set only on
  // success. Add and remove are collective over the world (every rank calls them in one order).
  Status AddProcessSet(std::vector<int> ranks, int* id);
  Status RemoveProcessSet(int id);
  Status ProcessSetRank(int id, int* rank) const;
  Status ProcessSetSize(int id, int* size) const;
  Status ProcessSetIncluded(int id, bool* included) const;
  std::vector<int> ProcessSetIds() const;
  Status ProcessSetRanks(int id, std::vector<int>* ranks) const;

  Status StartTimeline(const std::string& path, bool mark_cycles);
  Status StopTimeline();

  // Drains or fails everything pending, stops every thread. Idempotent.
  Status Shutdown();

  // Where the runtime is in its life (lifecycle.h).
  Phase phase() const { return life_.phase(); }

 private:
  using SetPtr = std::shared_ptr<ProcessSet>;

  Runtime(Config config, std::unique_ptr<Transport> transport, std::vector<Backend*> backends);
  // A world collective (every rank, same order): creates and registers set `id`.
  Status CreateSet(int id, std::vector<int> ranks);

  // One-member sets run their collectives on the caller's thread (runtime_inline.cc).
  bool RunsInline(const ProcessSet& st,
                  const std::vector<std::shared_ptr<TensorEntry>>& entries) const;
  Status RunInline(ProcessSet& st, std::vector<std::shared_ptr<TensorEntry>> entries);

  // Set administration (runtime_process_sets.cc).
  // Queues op for the global set's rounds and waits for its result (or the end of the runtime).
  Status RunAdmin(std::shared_ptr<AdminOp> op);
  bool ApplyAdmin(const std::vector<uint64_t>& words, bool shutdown);
  void ApplyAdd(AdminOp& op);
  void ApplyRemove(const std::shared_ptr<AdminOp>& op);
  void FinishRemovals();
  void FailAdmin();

  // The control loop (runtime_control_loop.cc), on the control thread.
  void Wake();  // from any thread
  void OnWake();
  void LetProducersFinish(const std::vector<SetPtr>& sets);
  bool ShouldStart(const ProcessSet& st, Clock::time_point now, Clock::time_point* wake_at) const;
  std::vector<uint64_t> OrderWords(const ProcessSet& st) const;
  void HandleResult(ProcessSet& st, RoundResult& result, Clock::time_point now);
  bool Sequenced(const ProcessSet& st) const;
  bool AnyHeld() const;
  // The global set has closed (in the same round on every rank, or when giving up on the peers):
  // no global round will release held batches any more.
  bool GlobalClosed() const;
  bool ReleaseHeld(const std::vector<uint64_t>& words);
  void CheckRoundDeadline(ProcessSet& st, Clock::time_point now);

  // Shutting down (runtime_shutdown.cc).
  // A transition the lifecycle refuses is a bug here: logged (both states named), never silent.
  void Advance(const Status& transition, const char* where);
  // `code`: what pending and later operations fail with (kPeerLost after a lost peer).
  void BeginShutdown(const std::string& reason, StatusCode code = StatusCode::kUnknownError);
  void CloseSet(ProcessSet& st, const Status& why);
  // Gives up on the peers: fails everything pending and later with `code` (kPeerLost when a peer
  // rank was lost, so Python raises HorovodInternalError).
  void Abandon(const std::string& reason, StatusCode code = StatusCode::kUnknownError);
  // The transport lost a peer rank (any thread): arms the process exit
  // (HOROVOD_PEER_LOSS_EXIT_SECONDS; not in an elastic job, HOROVOD_ELASTIC) and has the control
  // thread fail everything and stop.
  void PeerLost(const Status& lost);
  void OnPeerLost(const Status& lost);  // the control thread's part
  // Arms the process exit (status 1, HOROVOD_PEER_LOSS_EXIT_SECONDS later; once per process) after
  // a peer loss or a stall shutdown. Any thread.
  void ExitLater(const std::string& why);
  Status ShutdownStatus() const;

  Config config_;
  std::unique_ptr<Transport> transport_;
  std::vector<Backend*> backends_;
  std::shared_ptr<Timeline> timeline_;  // shared with the executors (they may outlive us)
  Clock::duration heartbeat_;
  // MPI_THREAD_SERIALIZED: batches of every set run on the control thread, so they run in one
  // order all ranks share (see ReleaseHeld).
  const bool sequenced_;

  ProcessSetTable sets_;

  boost::asio::io_context io_;
  boost::asio::steady_timer timer_;
  // When the pending wait on timer_ fires; max() when none is pending. Control thread only.
  Clock::time_point timer_due_ = Clock::time_point::max();
  std::atomic<bool> wake_posted_{false};
  std::thread control_thread_;

  // Control thread only.
  int next_seq_ = 0;  // the seq of the next set created
  std::deque<std::shared_ptr<AdminOp>> admin_;
  std::vector<std::shared_ptr<TensorEntry>> drained_;  // a queue's drained entries (kept empty)

  Lifecycle life_;
  // Which caller of Shutdown() does the work (the others return at once). Not a phase: Shutdown()
  // may be called in every phase, and the control thread keeps advancing the phase (Running,
  // Draining, Drained) while the caller waits; it says who stops the threads, not where the
  // runtime is. The other facts that once sat beside the phase are not the runtime's life either:
  // whether the global set's rounds have ended is that set's own `closed` (GlobalClosed()); the
  // exit timer belongs to the process (ExitLater), which it outlives; and a second peer-loss report
  // needs no flag, since the first to reach the control thread stops it (PeerLost).
  std::atomic<bool> shutdown_claimed_{false};
  // The transport reported a lost peer (any thread): after it, a transport whose waits all end
  // (Transport::loss_ends_every_wait) lets Shutdown() join every thread and free the world.
  std::atomic<bool> lost_reported_{false};
};

}  // namespace hvdc

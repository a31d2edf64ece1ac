// ProcessSet: one process set as the runtime drives it -- its ranks, channels, queue, negotiator
// and executor, and when its next negotiation round should start.
//
// Threads: `id`, `seq`, `ranks` and `set_rank` never change after creation and `queue` locks
// itself (enqueuing threads push into it); every other field is read and written only by the
// control thread. Sets are shared (shared_ptr) because an enqueuing thread may still hold one
// while the control thread removes it.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "core/batch.h"
#include "core/executor.h"
#include "core/negotiator.h"
#include "core/tensor_queue.h"
#include "core/transport.h"

namespace hvdc {

class ProcessSet {
 public:
  using Clock = std::chrono::steady_clock;

  // What a member needs to build its negotiator and executor.
  struct Parts {
    const Config* config = nullptr;
    Transport* transport = nullptr;
    std::shared_ptr<Timeline> timeline;
    std::vector<Backend*> backends;
    std::function<void()> wake;  // the executor calls it when it goes idle, if asked to
  };

  // Creates the set's channels (collective over the whole world: every rank calls it, in the same
  // order) and, on a member, its negotiator and executor. `seq` is the creation number.
  static Status Create(int id, int seq, std::vector<int> ranks, const Parts& parts,
                       std::shared_ptr<ProcessSet>* out);

  bool member() const { return set_rank >= 0; }

  // Whether the control thread should start a round of this set now. `global_work`: the global
  // set has something to agree on besides tensors (a set change, held batches to release).
  // `heartbeat`: how often an idle member still joins a round. Otherwise lowers *wake_at to when
  // it should look again.
  bool ShouldStart(Clock::time_point now, Clock::duration cycle_time, bool global_work,
                   Clock::duration heartbeat, Clock::time_point* wake_at) const;
  // Called with each round's outcome: backs off retries while rounds make no progress.
  void RoundEnded(Clock::time_point now, bool progress);
  // Polling schedule of a round in flight (there is no completion notification to wait on).
  void RoundStarted(Clock::time_point now);
  Clock::time_point NextPoll(Clock::time_point now, bool busy);

  const int id;
  const int seq;                 // creation order (0: the global set); the same on every rank
  const std::vector<int> ranks;  // world ranks, sorted
  int set_rank = -1;             // -1: this rank is not a member
  ProcessSetChannels channels;
  TensorQueue queue;
  std::unique_ptr<Negotiator> negotiator;
  std::unique_ptr<Executor> executor;

  // Control thread only.
  bool closed = false;
  // Set when a removal is agreed (the set moves to the closing list); tells remove_process_set
  // once the set is gone on this rank.
  std::function<void(Status)> removed;
  // Sequenced execution (see execution_order.h): batches of agreed rounds not yet released by a
  // round of the global set, one entry per round.
  std::deque<std::vector<Batch>> held;
  Clock::time_point first_unsent{};
  Clock::time_point last_round_end{};
  Clock::time_point round_warned{};

 private:
  ProcessSet(int id, int seq, std::vector<int> ranks) : id(id), seq(seq), ranks(std::move(ranks)) {}

  Clock::time_point next_retry_{};
  Clock::duration retry_backoff_{};
  Clock::duration poll_delay_{};
  Clock::time_point next_poll_{};
};

}  // namespace hvdc

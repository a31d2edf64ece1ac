// Lifecycle: the one state of a Runtime's life, with the transitions it may take written once.
//
//   Starting ──▶ Running ──▶ Draining ──▶ Drained ──▶ Down
//       │           │            │                     ▲
//       │           └────────────┴──▶ Abandoned ───────┤
//       └──────────────────────────────────────────────┘
//
//   Starting   Create() is wiring the runtime; the control thread has not started.
//   Running    operations are accepted.
//   Draining   an orderly shutdown: asked for here (shutdown()) or agreed with the peers in a
//              round. Later operations are refused; every set closes in one of its own rounds, and
//              what is pending drains or fails.
//   Drained    every set has closed; the control thread stops.
//   Abandoned  gave up on the peers (one was lost, a round stalled past
//              HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, or a shutdown did not complete): everything
//              pending failed here, without waiting for anyone; the control thread stops, and an
//              executor may stay stuck in communication with a dead peer.
//   Down       Shutdown() has joined every thread (after Abandoned, an executor stuck with a dead
//              peer is left behind) and, after Drained, released the transport. Starting goes
//              there directly when Create() fails.
//
// The first state after Running fixes why later operations fail (the status of Leave()); an
// abandoned drain keeps the drain's reason. A transition not drawn above is a bug in the runtime:
// Enter() refuses it with both states named, and the state stays as it was.
//
// Thread-safety: any thread may read the state (one atomic load: enqueue asks on every call) and
// wait for the control thread to stop; transitions are serialised by a mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

#include "core/status.h"

namespace hvdc {

enum class Phase { kStarting, kRunning, kDraining, kDrained, kAbandoned, kDown };

const char* PhaseName(Phase phase);

// Whether the diagram above has the arrow from -> to.
bool TransitionAllowed(Phase from, Phase to);

class Lifecycle {
 public:
  using Clock = std::chrono::steady_clock;

  Phase phase() const { return phase_.load(std::memory_order_acquire); }
  bool running() const { return phase() == Phase::kRunning; }
  // The control thread has stopped or stops at the end of its current task: nothing more is
  // negotiated, and a task posted to it may never run.
  bool settled() const { return Settled(phase()); }

  // Moves to `to` if the diagram allows it; else an error naming both states (nothing changes).
  Status Enter(Phase to);
  // Running -> Draining or Abandoned, recording why later operations fail: `why` (with `code`),
  // or the generic shut-down message when `why` is empty. Draining -> Abandoned keeps the drain's
  // reason (the operations have already been told it).
  Status Leave(Phase to, const std::string& why, StatusCode code);

  // What operations refused after Running fail with.
  Status why() const;
  // When the runtime left Running (the epoch before that).
  Clock::time_point left_running_at() const;

  // Waits up to `limit` for settled(); true once it is.
  bool WaitSettled(Clock::duration limit) const;

 private:
  static bool Settled(Phase p) {
    return p == Phase::kDrained || p == Phase::kAbandoned || p == Phase::kDown;
  }
  // Leaving Running records `why` (the generic message when null or empty).
  Status EnterLocked(Phase to, const std::string* why, StatusCode code);

  mutable std::mutex mu_;  // serialises transitions; guards why_ and left_at_ (with cv_)
  mutable std::condition_variable cv_;
  std::atomic<Phase> phase_{Phase::kStarting};
  Status why_;
  Clock::time_point left_at_{};
};

}  // namespace hvdc

// Backoff: how a runtime thread waits for something it can only poll for (an MPI request, a peer's
// flag in shared memory) without taking the CPU core the model's own threads need.
//
//   Backoff backoff;
//   while (!Ready()) backoff.Pause();
//
// A wait goes through three stages, by the time since it began:
//   spin   poll back to back: the answer usually comes within microseconds (the peer is already
//          there), and sleeping would add the kernel's wake-up latency to every operation;
//   yield  sched_yield between polls: another thread runnable on this core gets it, an idle core
//          keeps polling (the peer is late, but probably not by much);
//   sleep  sleep between polls, doubling from sleep_min up to sleep_max: the peer is still
//          computing. A poll after a sleep is at most about as late as the time already waited
//          (doubling), and never more than sleep_max.
// There is no unbounded busy loop: after `yield` every poll costs a sleep. The wait itself is
// unbounded; what ends a wait for a peer that never comes is the peer-loss rules (the transport's
// lost-peer report, HOROVOD_PEER_LOSS_EXIT_SECONDS), not the backoff. docs/waiting.md has the
// numbers behind the defaults.
#pragma once

#include <chrono>

namespace hvdc {

struct BackoffPolicy {
  using Duration = std::chrono::steady_clock::duration;
  Duration spin;       // poll back to back until this long into the wait
  Duration yield;      // then yield between polls until this long into the wait
  Duration sleep_min;  // then sleep: first this long,
  Duration sleep_max;  // doubling up to this
};

// The runtime's waits: spin 20 us, yield to 100 us, then sleep 20 us doubling to 1 ms.
BackoffPolicy DefaultBackoffPolicy();

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Stage { kSpin, kYield, kSleep };

  explicit Backoff(const BackoffPolicy& policy = DefaultBackoffPolicy());

  // What to do before the next poll, `elapsed` after the wait began; for kSleep, *sleep is how
  // long (each kSleep answer doubles the next one, up to sleep_max). The policy without the clock,
  // for tests and for loops that sleep on a timer of their own.
  Stage Next(Clock::duration elapsed, Clock::duration* sleep);

  // Waits before the next poll, as Next() says for the time since construction or Reset().
  void Pause();

  // A new wait begins now (the stages start over).
  void Reset();

 private:
  BackoffPolicy policy_;
  Clock::time_point start_;
  Clock::duration next_sleep_;
};

}  // namespace hvdc

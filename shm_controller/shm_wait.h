// Waiting on a peer's RankLine: spin briefly, then sched_yield, then sleep on the counter as a
// futex, each sleep bounded so that a check (abort flag, the peer's liveness) runs at least every
// kSleepSlice. Publishing wakes sleepers with one FUTEX_WAKE, and only when some are asleep, so a
// steady state where the ranks keep pace makes no system call.
#pragma once

#include <cstdint>
#include <functional>

#include "core/status.h"
#include "shm_controller/shm_layout.h"

namespace hvdc {
namespace shm {

// Tunables (not settings): the spin is about the time of a small copy by a peer; the slice bounds
// how late a check runs (and so a lost peer's detection) beyond its own limit.
constexpr int kSpinRounds = 2000;
constexpr int kYieldRounds = 64;
constexpr int64_t kSleepSliceNs = 20 * 1000 * 1000;

// True when counter has reached target (wrapping: compared as a signed distance).
inline bool Reached(uint32_t counter, uint32_t target) {
  return static_cast<int32_t>(counter - target) >= 0;
}

// Stores the new counter value and wakes anyone asleep on it.
void Publish(RankLine* line, uint32_t value);

// Waits until line->counter reaches target. `check` runs whenever the wait goes to sleep and
// after every sleep; a non-OK status ends the wait with it.
Status WaitReached(RankLine* line, uint32_t target, const std::function<Status()>& check);

// Wakes every sleeper on line (after an abort, so they see it at once).
void WakeAll(RankLine* line);

}  // namespace shm
}  // namespace hvdc

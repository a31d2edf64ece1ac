#include "core/backoff.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace hvdc {

using std::chrono::microseconds;
using std::chrono::milliseconds;

BackoffPolicy DefaultBackoffPolicy() {
  // spin: a peer already there answers within a few microseconds (a small allreduce at np=2 over
  // shared memory takes about 1 us, bench B0), so 20 us covers it with margin while a wait for a
  // computing peer burns at most 20 us of CPU. yield: 80 us more, for a peer that is nearly there.
  // sleep: from 20 us (Linux adds its 50 us timer slack) to 1 ms -- a sleeping wait costs one
  // wake-up per millisecond at most (well under 1 % of a core), and when the peer arrives, the
  // poll it waits for is at most 1 ms late (less than the time already waited until then).
  return BackoffPolicy{microseconds(20), microseconds(100), microseconds(20), milliseconds(1)};
}

Backoff::Backoff(const BackoffPolicy& policy)
    : policy_(policy), start_(Clock::now()), next_sleep_(policy.sleep_min) {}

void Backoff::Reset() {
  start_ = Clock::now();
  next_sleep_ = policy_.sleep_min;
}

Backoff::Stage Backoff::Next(Clock::duration elapsed, Clock::duration* sleep) {
  if (elapsed < policy_.spin) return Stage::kSpin;
  if (elapsed < policy_.yield) return Stage::kYield;
  *sleep = std::min(next_sleep_, policy_.sleep_max);
  next_sleep_ = std::min(next_sleep_ * 2, policy_.sleep_max);
  return Stage::kSleep;
}

void Backoff::Pause() {
  Clock::duration sleep{};
  switch (Next(Clock::now() - start_, &sleep)) {
    case Stage::kSpin:
      return;
    case Stage::kYield:
      sched_yield();
      return;
    case Stage::kSleep:
      std::this_thread::sleep_for(sleep);
      return;
  }
}

}  // namespace hvdc

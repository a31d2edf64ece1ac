#include "core/process_set.h"

#include <fmt/format.h>

#include <algorithm>

namespace hvdc {

using std::chrono::microseconds;
using std::chrono::milliseconds;

Status ProcessSet::Create(int id, int seq, std::vector<int> ranks, const Parts& parts,
                          std::shared_ptr<ProcessSet>* out) {
  std::shared_ptr<ProcessSet> st(new ProcessSet(id, seq, std::move(ranks)));
  HVDC_RETURN_IF_ERROR(parts.transport->CreateProcessSet(st->ranks, &st->channels));
  const int world_rank = parts.transport->topology().rank;
  auto it = std::find(st->ranks.begin(), st->ranks.end(), world_rank);
  if (it != st->ranks.end()) {
    if (!st->channels.control || !st->channels.data) {
      return Status::UnknownError(fmt::format("process set {}: no channels for a member", id));
    }
    st->set_rank = static_cast<int>(it - st->ranks.begin());
    st->negotiator = std::make_unique<Negotiator>(id, *parts.config, st->channels.control.get(),
                                                  parts.timeline.get(), st->ranks);
    st->executor = std::make_unique<Executor>(id, *parts.config, st->channels.data.get(),
                                              parts.timeline, parts.backends, &st->queue,
                                              parts.wake, parts.transport->threads_supported());
    st->executor->SetCoordinator(st->ranks.front());
    st->last_round_end = Clock::now();
  }
  *out = std::move(st);
  return Status::OK();
}

bool ProcessSet::ShouldStart(Clock::time_point now, Clock::duration cycle_time, bool global_work,
                             Clock::duration heartbeat, Clock::time_point* wake_at) const {
  const Negotiator& c = *negotiator;
  if (c.has_unsent()) {
    if (!c.shutdown_requested() && executor->BusyOrWakeWhenIdle()) {
      // Let tensors accumulate while a batch runs (the executor wakes us when it is idle).
      const auto deadline = first_unsent + cycle_time;
      if (now < deadline) {
        *wake_at = std::min(*wake_at, deadline);
        return false;
      }
    }
    return true;
  }
  if (c.has_pending() || global_work) {
    if (now >= next_retry_) return true;
    *wake_at = std::min(*wake_at, next_retry_);
    return false;
  }
  const auto beat = last_round_end + heartbeat;
  if (now >= beat) return true;
  *wake_at = std::min(*wake_at, beat);
  return false;
}

void ProcessSet::RoundEnded(Clock::time_point now, bool progress) {
  last_round_end = now;
  retry_backoff_ =
      progress ? Clock::duration::zero()
               : std::clamp<Clock::duration>(retry_backoff_ * 2, microseconds(50), milliseconds(1));
  next_retry_ = now + retry_backoff_;
}

void ProcessSet::RoundStarted(Clock::time_point now) {
  poll_delay_ = Clock::duration::zero();
  next_poll_ = now;
}

ProcessSet::Clock::time_point ProcessSet::NextPoll(Clock::time_point now, bool busy) {
  if (now >= next_poll_) {
    const Clock::duration cap = busy ? milliseconds(1) : milliseconds(10);
    poll_delay_ = std::clamp<Clock::duration>(poll_delay_ * 2, microseconds(10), cap);
    next_poll_ = now + poll_delay_;
  }
  return next_poll_;
}

}  // namespace hvdc

// The control thread's loop: when each process set starts a negotiation round, what happens with
// a round's result, and the order batches run in when MPI cannot run two threads.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <thread>

#include "core/clock.h"
#include "core/execution_order.h"
#include "core/fusion_planner.h"
#include "core/logging.h"
#include "core/runtime.h"

namespace hvdc {

using std::chrono::microseconds;
using std::chrono::milliseconds;

void Runtime::Wake() {
  if (!wake_posted_.exchange(true)) {
    boost::asio::post(io_, [this] { OnWake(); });
  }
}

bool Runtime::Sequenced(const ProcessSet& st) const {
  return sequenced_ && st.seq > 0 && st.member() && st.ranks.size() > 1;
}

bool Runtime::AnyHeld() const {
  for (auto& st : sets_.All()) {
    if (!st->held.empty()) return true;
  }
  return false;
}

bool Runtime::GlobalClosed() const {
  SetPtr global = sets_.Find(0);
  return !global || global->closed;
}

bool Runtime::ShouldStart(const ProcessSet& st, Clock::time_point now,
                          Clock::time_point* wake_at) const {
  // The global set's rounds also agree on process-set changes and release held batches.
  const bool global_work = st.id == 0 && (!admin_.empty() || (sequenced_ && AnyHeld()));
  Clock::duration heartbeat = heartbeat_;
  if (st.id == 0 && sequenced_ && sets_.AnySubsetOfSeveral()) {
    // Batches of a set held on its members wait for a global round, which idle ranks (members or
    // not) join only on their heartbeat: keep it short while such sets exist.
    heartbeat = std::min<Clock::duration>(heartbeat, milliseconds(10));
  }
  return st.ShouldStart(now, Seconds(config_.cycle_time_ms / 1000.0), global_work, heartbeat,
                        wake_at);
}

std::vector<uint64_t> Runtime::OrderWords(const ProcessSet& st) const {
  if (st.id != 0) return {};
  std::vector<HeldRounds> held;
  for (auto& s : sets_.All()) {
    if (Sequenced(*s)) held.push_back({s->seq, s->held.size()});
  }
  const bool change = !admin_.empty();
  return EncodeOrderWords(change, change ? admin_.front()->hash : 0, next_seq_, held);
}

void Runtime::OnWake() {
  wake_posted_.store(false);
  const auto spin_until = Clock::now() + microseconds(30);
  bool spun_round = false;  // spin only for rounds this call started, never on timer polls
  for (bool first = true;; first = false) {
    std::vector<SetPtr> sets;
    for (auto& st : sets_.All()) {
      if (st->member() && !st->closed) sets.push_back(st);
    }
    if (first) LetProducersFinish(sets);
    const auto now = Clock::now();
    auto wake_at = now + std::chrono::hours(1);
    bool any_in_round = false;
    bool started = false;  // a round started in this pass: worth a short spin
    for (auto& sp : sets) {
      ProcessSet& st = *sp;
      Negotiator& c = *st.negotiator;
      st.queue.DrainInto(&drained_);
      if (!drained_.empty() && !c.has_unsent()) st.first_unsent = now;
      for (auto& e : drained_) c.Submit(std::move(e));
      drained_.clear();
      for (int k = 0; k < 8 && !st.closed; ++k) {
        if (!c.in_round()) {
          if (!ShouldStart(st, now, &wake_at)) break;
          c.StartRound(now, OrderWords(st));
          started = true;
          st.RoundStarted(now);
        }
        RoundResult result;
        if (!c.Poll(now, &result)) break;
        HandleResult(st, result, now);
      }
      if (!st.closed && c.in_round()) {
        any_in_round = true;
        CheckRoundDeadline(st, now);
      }
    }
    FinishRemovals();
    // Abandoned has closed every set already; a drain ends when its last set closes.
    const Phase phase = life_.phase();
    if (phase == Phase::kAbandoned ||
        (phase == Phase::kDraining &&
         std::all_of(sets.begin(), sets.end(), [](auto& s) { return s->closed; }))) {
      if (phase == Phase::kDraining) Advance(life_.Enter(Phase::kDrained), "OnWake");
      io_.stop();
      return;
    }
    // Spin briefly for the round to finish (latency) -- but not while a batch executes: on a rank
    // pinned to one core the spinning would take the executor's CPU.
    spun_round |= started;
    if (any_in_round && spun_round && Clock::now() < spin_until &&
        std::none_of(sets.begin(), sets.end(), [](auto& s) { return s->executor->busy(); })) {
      continue;
    }
    for (auto& sp : sets) {
      ProcessSet& st = *sp;
      if (st.closed || !st.negotiator->in_round()) continue;
      const bool busy =
          st.negotiator->has_pending() || st.negotiator->has_unsent() || !life_.running();
      wake_at = std::min(wake_at, st.NextPoll(now, busy));
    }
    // A pending wait due no later is kept: firing early only runs this loop once more, and
    // re-arming on every pass would cost a system call per operation (timerfd_settime).
    if (timer_due_ > wake_at) {
      timer_due_ = wake_at;
      timer_.expires_at(wake_at);
      timer_.async_wait([this](const boost::system::error_code& ec) {
        if (ec) return;  // cancelled by a re-arm, or the loop has stopped
        timer_due_ = Clock::time_point::max();
        OnWake();
      });
    }
    return;
  }
}

// A framework often submits a burst of tensors (a whole gradient list) from one thread. Woken by
// its first tensor, this thread would preempt it -- on a rank pinned to one core, at once -- and
// negotiate the burst in many small rounds. So before starting a round, give the CPU back while
// the queues are still growing (bounded: a steady trickle is negotiated after 50 us). With no
// producer running the first yield returns at once and costs about a microsecond.
void Runtime::LetProducersFinish(const std::vector<SetPtr>& sets) {
  auto pending = [&sets] {
    size_t n = 0;
    for (auto& st : sets) {
      if (!st->negotiator->in_round()) n += st->queue.pending();
    }
    return n;
  };
  size_t last = pending();
  if (last == 0) return;
  const auto deadline = Clock::now() + microseconds(50);
  for (int i = 0; i < 64 && Clock::now() < deadline; ++i) {
    std::this_thread::yield();
    const size_t now = pending();
    if (now == last) return;
    last = now;
  }
}

void Runtime::HandleResult(ProcessSet& st, RoundResult& result, Clock::time_point now) {
  bool progress = !result.ready.empty() || result.exchanged_requests;
  if (!result.ready.empty()) {
    std::vector<Batch> batches =
        PlanBatches(std::move(result.ready), config_, st.negotiator->size());
    if (!Sequenced(st)) {
      st.executor->Submit(std::move(batches));
    } else if (GlobalClosed()) {
      // No global round will release them any more -- on any rank (see CloseSet).
      const Status why = ShutdownStatus();
      for (auto& b : batches) {
        b.error_code = why.code();
        b.error_message = why.message();
      }
      st.executor->Submit(std::move(batches));
    } else {
      st.held.push_back(std::move(batches));
    }
  }
  if (st.id == 0) {
    // The same decisions on every rank, at the same round: first this round's own batches (run
    // above), then the released batches of the other sets in creation order, then the change.
    progress |= ReleaseHeld(result.extra);
    progress |= ApplyAdmin(result.extra, result.shutdown);
  }
  st.RoundEnded(now, progress);
  if (result.shutdown) {
    BeginShutdown(result.shutdown_reason, result.shutdown_code);
    CloseSet(st, ShutdownStatus());
    return;
  }
  if (result.removed) {
    CloseSet(st, Status::InvalidArgument(fmt::format("process set {} was removed", st.id)));
  }
}

// Sequenced execution: with MPI_THREAD_SERIALIZED every batch runs inline on the control thread
// and blocks it until the set's other members run the same batch. Running each set's batches as
// its rounds complete would let ranks pick different orders across overlapping sets (rank 0 runs
// set C's batch while rank 1 runs set A's, ...): a cycle no rank can leave. So a set's batches are
// held until a round of the global set releases them: only as many rounds' batches as every member
// holds (execution_order.h), in creation order of the sets. Every rank thus runs the batches of
// all its sets in one global order -- (global round, set, position) -- and a member runs a batch
// only when every other member has it too.
bool Runtime::ReleaseHeld(const std::vector<uint64_t>& words) {
  auto sets = sets_.All();
  std::sort(sets.begin(), sets.end(), [](auto& a, auto& b) { return a->seq < b->seq; });
  bool released = false;
  for (auto& sp : sets) {
    ProcessSet& st = *sp;
    if (!Sequenced(st) || st.held.empty()) continue;
    const int n = ReleasableRounds(words, st.seq);
    for (int i = 0; i < n && !st.held.empty(); ++i) {
      std::vector<Batch> batches = std::move(st.held.front());
      st.held.pop_front();
      st.executor->Submit(std::move(batches));
      released = true;
    }
  }
  return released;
}

void Runtime::CheckRoundDeadline(ProcessSet& st, Clock::time_point now) {
  const auto waited = now - st.negotiator->round_started();
  const double waited_s = std::chrono::duration<double>(waited).count();
  const bool warn = !config_.stall_check_disable && waited > Seconds(config_.stall_check_time_s) &&
                    now - st.round_warned > Seconds(config_.stall_check_time_s);
  const bool give_up =
      config_.stall_shutdown_time_s > 0 &&
      waited > Seconds(config_.stall_shutdown_time_s) + heartbeat_ + std::chrono::seconds(1);
  if (!warn && !give_up) return;
  // Name the ranks whose part of the round has not arrived, when the channel can tell.
  std::vector<int> missing;
  const bool known = st.negotiator->WaitingFor(&missing) && !missing.empty();
  const std::string who = known ? fmt::format("ranks {}", missing)
                                : fmt::format(
                                      "some of the ranks {} (the transport cannot tell "
                                      "which)",
                                      st.ranks);
  if (warn) {
    LogWarning(
        "process set {}: a negotiation round has waited {:.1f} s for {} to take part; they may "
        "be stuck outside horovod_compat, or dead",
        st.id, waited_s, who);
    st.round_warned = now;
  }
  if (give_up) {
    const std::string why = fmt::format(
        "process set {}: {} did not take part in negotiation for {:.1f} s "
        "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={}); a rank is stuck or dead. Shutting down",
        st.id, who, waited_s, config_.stall_shutdown_time_s);
    ExitLater(why);
    Abandon(why);
    return;
  }
  if (!life_.running() && now - life_.left_running_at() > std::chrono::seconds(60)) {
    Abandon(
        fmt::format("shutdown: process set {} (ranks {}) did not complete its last "
                    "negotiation round within 60 s; a rank is stuck or dead",
                    st.id, st.ranks));
  }
}

}  // namespace hvdc

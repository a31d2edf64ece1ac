// Shutting down: the orderly path (every rank agrees in a round, pending work drains or fails) and
// giving up on peers that no longer take part (stall shutdown, a shutdown that cannot complete).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/clock.h"
#include "core/logging.h"
#include "core/runtime.h"

namespace hvdc {
namespace {

// How long Shutdown() waits for an executor thread to return once the transport failed every wait
// after a lost peer (it returns at once; the bound only guards against a backend that does not).
constexpr auto kAbandonedExecutorLimit = std::chrono::seconds(10);

}  // namespace

void Runtime::Advance(const Status& transition, const char* where) {
  if (!transition.ok()) LogFatal("internal error in Runtime::{}: {}", where, transition.message());
}

Status Runtime::ShutdownStatus() const { return life_.why(); }

void Runtime::BeginShutdown(const std::string& reason, StatusCode code) {
  if (!life_.running()) return;
  Advance(life_.Leave(Phase::kDraining, reason, code), "BeginShutdown");
  if (!reason.empty()) LogError("{}", reason);
  for (auto& st : sets_.All()) {
    st->queue.Close(ShutdownStatus());
    if (st->member() && !st->closed) st->negotiator->RequestShutdown(reason);
  }
}

void Runtime::CloseSet(ProcessSet& st, const Status& why) {
  st.closed = true;
  st.queue.Close(why);
  auto pending = st.negotiator->TakeAllPending();
  for (auto& e : st.queue.Drain()) pending.push_back(std::move(e));
  if (!pending.empty()) {
    // Fail them on the executor, after every batch already agreed (callbacks never run here).
    Batch failed;
    failed.error_code = why.code();
    failed.error_message = why.message();
    for (auto& e : pending) {
      auto r = std::make_shared<Response>();
      r->name = e->request.name;
      failed.items.push_back(BatchItem{std::move(r), std::move(e)});
    }
    std::vector<Batch> batches;
    batches.push_back(std::move(failed));
    st.executor->Submit(std::move(batches));
  }
  // Held batches of a closed set still run when a global round releases them (the other members
  // may close it later, and run them). Once the global set closes -- in the same round on every
  // rank -- nothing is released any more, anywhere: fail what is held.
  if (st.id == 0) {
    FailAdmin();
    const Status down = ShutdownStatus();
    for (auto& sp : sets_.All()) {
      for (auto& batches : sp->held) {
        for (auto& b : batches) {
          b.error_code = down.code();
          b.error_message = down.message();
        }
        sp->executor->Submit(std::move(batches));
      }
      sp->held.clear();
    }
  }
}

void Runtime::Abandon(const std::string& reason, StatusCode code) {
  LogError("{}", reason);
  // After a drain began, operations keep the drain's reason (Lifecycle::Leave).
  Advance(life_.Leave(Phase::kAbandoned, reason, code), "Abandon");
  const Status why = Status::FromCode(code, reason);
  FailAdmin();
  for (auto& sp : sets_.All()) {
    ProcessSet& st = *sp;
    st.queue.Close(why);
    if (!st.member() || st.closed) continue;
    st.closed = true;
    auto pending = st.negotiator->TakeAllPending();
    for (auto& e : st.queue.Drain()) pending.push_back(std::move(e));
    // Peers are gone: the executor may never return, so fail these here.
    for (auto& e : pending) {
      st.queue.Release(e->request.name);
      e->completion->MemberDone(why);
    }
    for (auto& batches : st.held) {
      for (auto& b : batches) Executor::Complete(b, why, &st.queue);
    }
    st.held.clear();
  }
}

void Runtime::ExitLater(const std::string& why) {
  // Once per process, not per runtime: the timer outlives the runtime that armed it, and a second
  // one could only fire later.
  static std::atomic<bool> armed{false};
  const double exit_s = config_.peer_loss_exit_s;
  if (exit_s <= 0 || armed.exchange(true)) return;
  // Ends the process even when the program never calls horovod_compat again (idle, or stuck
  // elsewhere). Detached: it touches nothing of the runtime, which may be gone by then.
  std::thread([exit_s, why] {
    std::this_thread::sleep_for(Seconds(exit_s));
    LogError(
        "{}; exiting with status 1 ({:g} s later, HOROVOD_PEER_LOSS_EXIT_SECONDS; 0 keeps the "
        "process alive)",
        why, exit_s);
    std::fflush(nullptr);
    std::_Exit(1);
  }).detach();
}

void Runtime::PeerLost(const Status& lost) {
  lost_reported_.store(true);
  // An elastic job's survivors re-initialise instead (hvd.elastic.run): the failed operations
  // raise HorovodInternalError, and the process lives on.
  if (!config_.elastic) ExitLater(lost.message());
  // The first loss to reach the control thread stops it; a later one (often a consequence of the
  // first) never runs, and neither does any if the thread had stopped already: that path has
  // failed everything.
  boost::asio::post(io_, [this, lost] { OnPeerLost(lost); });
}

void Runtime::OnPeerLost(const Status& lost) {
  if (life_.settled()) return;
  Abandon(fmt::format(
              "{}. A peer rank was lost: every pending and later operation fails, and this rank "
              "shuts down",
              lost.message()),
          StatusCode::kPeerLost);
  io_.stop();
}

Status Runtime::Shutdown() {
  if (shutdown_claimed_.exchange(true)) return Status::OK();
  if (!control_thread_.joinable()) {  // Create() failed before starting it
    for (auto& st : sets_.All()) {
      if (st->executor) st->executor->Stop();
    }
    sets_.Clear();
    transport_->Finalize();
    Advance(life_.Enter(Phase::kDown), "Shutdown");
    return Status::OK();
  }
  boost::asio::post(io_, [this] {
    BeginShutdown("");
    Wake();
  });
  const double limit = std::max(60.0, config_.stall_shutdown_time_s + 10);
  if (!life_.WaitSettled(Seconds(limit))) {
    boost::asio::post(io_, [this, limit] {
      if (!life_.settled()) {
        Abandon(
            fmt::format("shutdown did not complete within {:.0f} s: a peer rank is stuck or "
                        "dead",
                        limit));
      }
      io_.stop();
    });
  }
  if (control_thread_.joinable()) control_thread_.join();
  transport_->SetPeerLostHandler(nullptr);
  const bool abandoned = life_.phase() == Phase::kAbandoned;
  // After a lost peer on a transport that then fails every wait, a busy executor returns soon:
  // wait for it, so a re-init (elastic) leaks no thread, channel or socket of this world.
  const bool returns_soon =
      abandoned && lost_reported_.load() && transport_->loss_ends_every_wait();
  bool left_behind = false;
  std::vector<SetPtr> sets = sets_.All();
  for (auto& st : sets) {
    if (!st->executor) continue;
    if (abandoned && st->executor->busy()) {
      // In communication with a dead peer: fail what it holds now. Unless its wait is known to
      // end, leave the thread behind with its data channel (it touches nothing else of ours when
      // it returns).
      st->executor->Abandon(ShutdownStatus());
      if (returns_soon && st->executor->JoinAbandoned(kAbandonedExecutorLimit)) continue;
      LogWarning("process set {}: an executor thread is stuck with a dead peer; left behind",
                 st->id);
      left_behind = true;
      (void)st->channels.control.release();
      (void)st->channels.data.release();
      continue;
    }
    st->executor->Stop();
  }
  timeline_->Stop();
  // After an abandonment the transport is released only when nothing can still be blocked in it
  // (MPI_Finalize with a dead peer could hang); else the destructor's turn.
  if (!left_behind && (!abandoned || returns_soon)) {
    sets_.Clear();
    sets.clear();
    transport_->Finalize();
  }
  Advance(life_.Enter(Phase::kDown), "Shutdown");
  return Status::OK();
}

}  // namespace hvdc

// Shutting down: the orderly path (every rank agrees in a round, pending work drains or fails) and
// giving up on peers that no longer take part (stall shutdown, a shutdown that cannot complete).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/clock.h"
#include "core/logging.h"
#include "core/runtime.h"

namespace hvdc {
namespace {

constexpr const char* kShutDownMessage =
    "Horovod has been shut down. This happens when one of the ranks called shutdown() or exited "
    "(for instance after an exception; look for it in that rank's log), or when a collective is "
    "used after shutdown.";

}  // namespace

Status Runtime::ShutdownStatus() const {
  return Status::FromCode(down_code_, down_reason_.empty() ? kShutDownMessage : down_reason_);
}

void Runtime::BeginShutdown(const std::string& reason, StatusCode code) {
  if (shutting_down_) return;
  shutting_down_ = true;
  shutdown_started_ = Clock::now();
  shutdown_reason_ = reason;
  down_reason_ = reason.empty() ? kShutDownMessage : reason;
  down_code_ = code;
  down_.store(true);
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
    global_closed_ = true;
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
  if (!shutting_down_) {
    down_reason_ = reason;
    down_code_ = code;
    down_.store(true);
    shutdown_started_ = Clock::now();
  }
  shutting_down_ = true;
  global_closed_ = true;
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
  std::lock_guard<std::mutex> state_lock(state_mu_);
  abandoned_ = true;
}

void Runtime::ExitLater(const std::string& why) {
  const double exit_s = config_.peer_loss_exit_s;
  if (exit_s <= 0 || exit_armed_.exchange(true)) return;
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
  if (peer_lost_.exchange(true)) return;  // one loss is enough; the others are its consequences
  ExitLater(lost.message());
  // If the control thread has already stopped (the failed round shut it down), this never runs:
  // that path has failed everything already.
  boost::asio::post(io_, [this, lost] { OnPeerLost(lost); });
}

void Runtime::OnPeerLost(const Status& lost) {
  Abandon(fmt::format(
              "{}. A peer rank was lost: every pending and later operation fails, and this rank "
              "shuts down",
              lost.message()),
          StatusCode::kPeerLost);
  std::lock_guard<std::mutex> lock(state_mu_);
  finished_ = true;
  state_cv_.notify_all();
  io_.stop();
}

Status Runtime::Shutdown() {
  if (shutdown_called_.exchange(true)) return Status::OK();
  if (!control_thread_.joinable()) {  // Create() failed before starting it
    for (auto& st : sets_.All()) {
      if (st->executor) st->executor->Stop();
    }
    sets_.Clear();
    transport_->Finalize();
    return Status::OK();
  }
  boost::asio::post(io_, [this] {
    BeginShutdown("");
    Wake();
  });
  {
    std::unique_lock<std::mutex> lock(state_mu_);
    const double limit = std::max(60.0, config_.stall_shutdown_time_s + 10);
    if (!state_cv_.wait_for(lock, Seconds(limit), [&] { return finished_; })) {
      lock.unlock();
      boost::asio::post(io_, [this, limit] {
        Abandon(
            fmt::format("shutdown did not complete within {:.0f} s: a peer rank is stuck or "
                        "dead",
                        limit));
        std::lock_guard<std::mutex> l(state_mu_);
        finished_ = true;
        io_.stop();
      });
    }
  }
  if (control_thread_.joinable()) control_thread_.join();
  transport_->SetPeerLostHandler(nullptr);
  bool abandoned;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    abandoned = abandoned_;
  }
  std::vector<SetPtr> sets = sets_.All();
  for (auto& st : sets) {
    if (!st->executor) continue;
    if (abandoned && st->executor->busy()) {
      // Stuck in communication with a dead peer: fail what it holds now, and leave the thread
      // behind with its data channel (it touches nothing else of ours when it returns).
      st->executor->Abandon(ShutdownStatus());
      (void)st->channels.control.release();
      (void)st->channels.data.release();
      continue;
    }
    st->executor->Stop();
  }
  timeline_->Stop();
  if (!abandoned) {
    sets_.Clear();
    sets.clear();
    transport_->Finalize();
  }
  return Status::OK();
}

}  // namespace hvdc

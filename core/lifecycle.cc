#include "core/lifecycle.h"

#include <fmt/format.h>

namespace hvdc {
namespace {

constexpr const char* kShutDownMessage =
    "Horovod has been shut down. This happens when one of the ranks called shutdown() or exited "
    "(for instance after an exception; look for it in that rank's log), or when a collective is "
    "used after shutdown.";

}  // namespace

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kStarting:
      return "Starting";
    case Phase::kRunning:
      return "Running";
    case Phase::kDraining:
      return "Draining";
    case Phase::kDrained:
      return "Drained";
    case Phase::kAbandoned:
      return "Abandoned";
    case Phase::kDown:
      return "Down";
  }
  return "unknown phase";
}

bool TransitionAllowed(Phase from, Phase to) {
  switch (from) {
    case Phase::kStarting:
      return to == Phase::kRunning || to == Phase::kDown;
    case Phase::kRunning:
      return to == Phase::kDraining || to == Phase::kAbandoned;
    case Phase::kDraining:
      return to == Phase::kDrained || to == Phase::kAbandoned;
    case Phase::kDrained:
    case Phase::kAbandoned:
      return to == Phase::kDown;
    case Phase::kDown:
      return false;
  }
  return false;
}

Status Lifecycle::EnterLocked(Phase to, const std::string* why, StatusCode code) {
  const Phase from = phase_.load(std::memory_order_relaxed);
  if (!TransitionAllowed(from, to)) {
    return Status::PreconditionError(fmt::format("runtime lifecycle: no transition from {} to {}",
                                                 PhaseName(from), PhaseName(to)));
  }
  if (from == Phase::kRunning) {
    // Written before the state is published: a thread that sees the new state reads the reason.
    why_ = Status::FromCode(code, why != nullptr && !why->empty() ? *why : kShutDownMessage);
    left_at_ = Clock::now();
  }
  phase_.store(to, std::memory_order_release);
  if (Settled(to)) cv_.notify_all();
  return Status::OK();
}

Status Lifecycle::Enter(Phase to) {
  std::lock_guard<std::mutex> lock(mu_);
  return EnterLocked(to, nullptr, StatusCode::kUnknownError);
}

Status Lifecycle::Leave(Phase to, const std::string& why, StatusCode code) {
  std::lock_guard<std::mutex> lock(mu_);
  return EnterLocked(to, &why, code);
}

Status Lifecycle::why() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (why_.ok()) return Status::UnknownError(kShutDownMessage);
  return why_;
}

Lifecycle::Clock::time_point Lifecycle::left_running_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return left_at_;
}

bool Lifecycle::WaitSettled(Clock::duration limit) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, limit, [this] { return settled(); });
}

}  // namespace hvdc

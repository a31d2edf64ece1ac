#include "core/executor.h"

#include <fmt/format.h>

#include "core/logging.h"
#include "core/timeline.h"

namespace hvdc {

Executor::Executor(int set_id, const Config& config, HostComm* comm, Timeline* timeline,
                   const std::vector<Backend*>* backends, TensorQueue* queue,
                   std::function<void()> on_idle, bool threaded)
    : set_id_(set_id), backends_(backends), queue_(queue), on_idle_(std::move(on_idle)) {
  ctx_.config = &config;
  ctx_.comm = comm;
  ctx_.buffer = &buffer_;
  ctx_.timeline = timeline;
  if (threaded) thread_ = std::thread([this] { Loop(); });
}

Executor::~Executor() { Stop(); }

void Executor::Submit(std::vector<Batch> batches) {
  if (batches.empty()) return;
  if (!thread_.joinable()) {
    for (auto& b : batches) Run(b);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      for (auto& b : batches) batches_.push_back(std::move(b));
      batches.clear();
    }
  }
  // After Stop() nothing would run them: run here, so every callback still runs exactly once.
  for (auto& b : batches) Run(b);
  cv_.notify_one();
}

bool Executor::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_ || !batches_.empty();
}

void Executor::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Executor::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !batches_.empty(); });
    if (batches_.empty()) return;  // stopping, and everything submitted has run
    Batch batch = std::move(batches_.front());
    batches_.pop_front();
    running_ = true;
    lock.unlock();
    Run(batch);
    lock.lock();
    running_ = false;
    if (batches_.empty() && on_idle_) {
      lock.unlock();
      on_idle_();
      lock.lock();
    }
  }
}

void Executor::Complete(Batch& batch, const Status& status, TensorQueue* queue) {
  for (auto& item : batch.items) {
    if (!item.entry) continue;
    if (queue) queue->Release(item.entry->request.name);
    item.entry->completion->MemberDone(status);
    item.entry.reset();
  }
}

void Executor::Run(Batch& batch) {
  Status status;
  if (batch.error_code != StatusCode::kOk) {
    status = batch.error_code == StatusCode::kAborted ? Status::Aborted(batch.error_message)
             : batch.error_code == StatusCode::kInvalidArgument
                 ? Status::InvalidArgument(batch.error_message)
             : batch.error_code == StatusCode::kUnknownError
                 ? Status::UnknownError(batch.error_message)
                 : Status::PreconditionError(batch.error_message);
  } else {
    Backend* backend = nullptr;
    for (Backend* b : *backends_) {
      if (b->Accepts(batch)) {
        backend = b;
        break;
      }
    }
    if (backend == nullptr) {
      status = Status::UnknownError(
          fmt::format("no backend can run {} of {} on device {} (was the GPU backend built?)",
                      OpTypeName(batch.op), batch.items.front().response.name, batch.device));
    } else {
      Timeline* tl = ctx_.timeline;
      const bool trace = tl && tl->active();
      if (trace) {
        for (auto& item : batch.items) tl->OpStart(item.response.name, batch.op);
      }
      try {
        status = backend->Execute(batch, ctx_);
      } catch (const std::exception& e) {
        status = Status::UnknownError(fmt::format("{} failed: {}", OpTypeName(batch.op), e.what()));
      }
      if (trace) {
        for (auto& item : batch.items) tl->OpEnd(item.response.name);
      }
    }
  }
  if (!status.ok() && batch.error_code == StatusCode::kOk) {
    LogError("process set {}: {} failed: {}", set_id_, OpTypeName(batch.op), status.message());
  }
  Complete(batch, status, queue_);
}

}  // namespace hvdc

#include "core/executor.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <string>

#include "core/logging.h"
#include "core/timeline.h"

namespace hvdc {

// Shared by the Executor and its thread; outlives both (see the header on Abandon).
struct Executor::State {
  int set_id = 0;
  int coordinator = -1;  // world rank, the origin of negotiated errors
  bool threaded = false;
  Config config;  // a copy: the Runtime's may be gone while an abandoned batch unwinds
  FusionBuffer buffer;
  std::shared_ptr<Timeline> timeline;
  std::vector<Backend*> backends;  // the backends themselves live for the whole process
  ExecutionContext ctx;
  TensorQueue* queue = nullptr;  // the Runtime's; never used once abandoned
  std::function<void()> on_idle;

  mutable std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::deque<Batch> batches;
  // The entries of the batch inside a backend, taken before it starts (a backend may move them).
  std::vector<std::shared_ptr<TensorEntry>> executing;
  bool running = false;         // a batch is executing or completing
  bool wake_when_idle = false;  // call on_idle once the queue runs dry (BusyOrWakeWhenIdle)
  bool touching = false;        // completing callbacks or calling on_idle: the Runtime is in use
  bool stopping = false;
  bool abandoned = false;
  bool exited = false;  // the thread has returned from Run (it touches nothing any more)
  Status abandon_status;
  // The entries Abandon() failed while their batch was inside a backend: an asynchronous backend
  // that completes them later (ctx.complete) must not complete them a second time.
  std::vector<std::shared_ptr<TensorEntry>> failed_by_abandon;

  // Backend states (core/backend.h) may still complete items through ctx.complete, which uses the
  // members above: let them finish while those exist.
  ~State() { ctx.states.clear(); }
};

Executor::Executor(int set_id, const Config& config, HostComm* comm,
                   std::shared_ptr<Timeline> timeline, std::vector<Backend*> backends,
                   TensorQueue* queue, std::function<void()> on_idle, bool threaded)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.set_id = set_id;
  s.threaded = threaded;
  s.config = config;
  s.timeline = std::move(timeline);
  s.backends = std::move(backends);
  s.queue = queue;
  s.on_idle = std::move(on_idle);
  s.ctx.config = &s.config;
  s.ctx.comm = comm;
  s.ctx.buffer = &s.buffer;
  s.ctx.timeline = s.timeline.get();
  // Asynchronous completion (ExecutionContext::complete, core/backend.h): a backend's own thread
  // (NCCL: waiting on CUDA events) completes its items here -- or the executor thread itself,
  // inside Execute, for items it can release early. Names are released under `mu` so that none is
  // released once Abandon() has begun (the queue may be gone then), and an item completed here
  // leaves `executing`, so Abandon() does not complete it a second time.
  s.ctx.complete = [&s](Batch& batch, const Status& status) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      for (auto& item : batch.items) {
        if (!item.entry) continue;
        const auto& failed = s.failed_by_abandon;
        if (std::find(failed.begin(), failed.end(), item.entry) != failed.end()) {
          item.entry.reset();  // its callback has run already
          continue;
        }
        auto& ex = s.executing;
        ex.erase(std::remove(ex.begin(), ex.end(), item.entry), ex.end());
        if (!s.abandoned && s.queue) s.queue->Release(item.entry->request.name);
      }
    }
    Complete(batch, status, nullptr);
  };
  if (threaded) {
    thread_ = std::thread(&Executor::Loop, state_);
    // Named from here, so the name is there once the constructor returns (top -H, gdb, perf).
    std::string name = "hvdc-exec-" + std::to_string(set_id);
    name.resize(std::min<size_t>(name.size(), 15));
    pthread_setname_np(thread_.native_handle(), name.c_str());
  }
}

Executor::~Executor() { Stop(); }

void Executor::Submit(std::vector<Batch> batches) {
  if (batches.empty()) return;
  State& s = *state_;
  if (!s.threaded) {
    for (auto& b : batches) Finish(s, b, Execute(s, b));
    return;
  }
  Status abandoned;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.abandoned) {
      abandoned = s.abandon_status;
    } else if (!s.stopping) {
      for (auto& b : batches) s.batches.push_back(std::move(b));
      batches.clear();
    }
  }
  if (!abandoned.ok()) {
    for (auto& b : batches) Complete(b, abandoned, s.queue);
    return;
  }
  // After Stop() nothing would run them: run here, so every callback still runs exactly once.
  for (auto& b : batches) Finish(s, b, Execute(s, b));
  s.cv.notify_all();
}

void Executor::SetCoordinator(int world_rank) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->coordinator = world_rank;
}

bool Executor::BusyOrWakeWhenIdle() {
  std::lock_guard<std::mutex> lock(state_->mu);
  const bool busy = state_->running || !state_->batches.empty();
  if (busy) state_->wake_when_idle = true;
  return busy;
}

bool Executor::busy() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->running || !state_->batches.empty();
}

void Executor::Stop() {
  bool stuck = false;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
    stuck = state_->abandoned && !state_->exited;
  }
  state_->cv.notify_all();
  if (!thread_.joinable()) return;
  // An abandoned thread may never return: never wait for it here (JoinAbandoned() may).
  if (stuck) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

bool Executor::JoinAbandoned(std::chrono::steady_clock::duration limit) {
  if (!thread_.joinable()) return true;
  State& s = *state_;
  bool exited = false;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    exited = s.cv.wait_for(lock, limit, [&] { return s.exited; });
  }
  if (exited) {
    thread_.join();
  } else {
    thread_.detach();
  }
  return exited;
}

void Executor::Abandon(const Status& status) {
  State& s = *state_;
  std::deque<Batch> queued;
  std::vector<std::shared_ptr<TensorEntry>> executing;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    if (s.abandoned) return;
    s.abandoned = true;
    s.abandon_status = status;
    s.cv.notify_all();
    // Callbacks (and the idle hook) already running use the Runtime: let them finish.
    s.cv.wait(lock, [&] { return !s.touching; });
    queued.swap(s.batches);
    executing.swap(s.executing);
    s.failed_by_abandon = executing;
  }
  for (auto& b : queued) Complete(b, status, s.queue);
  // The thread keeps its own references to these entries (its backend may still use their
  // buffers); it skips completing them once it sees `abandoned`.
  for (auto& e : executing) {
    if (s.queue) s.queue->Release(e->request.name);
    e->completion->MemberDone(status);
  }
}

void Executor::Loop(std::shared_ptr<State> sp) {
  State& s = *sp;
  Run(s);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.exited = true;
  }
  s.cv.notify_all();
}

void Executor::Run(State& s) {
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    s.cv.wait(lock, [&] { return s.stopping || s.abandoned || !s.batches.empty(); });
    // Stopping: everything submitted has run. Abandoned: Abandon() completed what was queued.
    if (s.abandoned || s.batches.empty()) return;
    Batch batch = std::move(s.batches.front());
    s.batches.pop_front();
    s.running = true;
    for (auto& item : batch.items) {
      if (item.entry) s.executing.push_back(item.entry);
    }
    lock.unlock();
    const Status status = Execute(s, batch);
    lock.lock();
    s.executing.clear();
    if (s.abandoned) return;  // Abandon() has completed this batch's items
    s.touching = true;
    lock.unlock();
    Finish(s, batch, status);
    lock.lock();
    s.running = false;
    if (s.batches.empty() && s.wake_when_idle && s.on_idle) {
      s.wake_when_idle = false;
      lock.unlock();
      s.on_idle();
      lock.lock();
    }
    s.touching = false;
    s.cv.notify_all();
  }
}

void Executor::Complete(Batch& batch, const Status& status, TensorQueue* queue) {
  if (queue) queue->Release(batch.items);  // the names first (one lock), then the callbacks
  for (auto& item : batch.items) {
    if (!item.entry) continue;
    item.entry->completion->MemberDone(status);
    item.entry.reset();
  }
}

Status Executor::Execute(State& s, Batch& batch) {
  if (batch.error_code != StatusCode::kOk) {
    // Negotiated by the coordinator, which every member was told of in the same round.
    return Status::FromCode(batch.error_code, batch.error_message).WithOrigin(s.coordinator);
  }
  Backend* backend = nullptr;
  for (Backend* b : s.backends) {
    if (b->Accepts(batch)) {
      backend = b;
      break;
    }
  }
  if (backend == nullptr) {
    return Status::UnknownError(
        fmt::format("no backend can run {} of {} on device {} (was the GPU backend built?)",
                    OpTypeName(batch.op), batch.items.front().response->name, batch.device));
  }
  Timeline* tl = s.timeline.get();
  const bool trace = tl && tl->active();
  if (trace) {
    for (auto& item : batch.items) tl->OpStart(item.response->name, batch.op);
  }
  Status status;
  try {
    status = backend->Execute(batch, s.ctx);
  } catch (const std::exception& e) {
    status = Status::UnknownError(fmt::format("{} failed: {}", OpTypeName(batch.op), e.what()));
  }
  if (trace) {
    for (auto& item : batch.items) tl->OpEnd(item.response->name);
  }
  return status;
}

void Executor::Finish(State& s, Batch& batch, const Status& status) {
  if (!status.ok() && batch.error_code == StatusCode::kOk) {
    LogError("process set {}: {} failed: {}", s.set_id, OpTypeName(batch.op), status.message());
  }
  Complete(batch, status, s.queue);
}

}  // namespace hvdc

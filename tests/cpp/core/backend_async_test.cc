// The asynchronous completion path of core/backend.h (ExecutionContext::complete and
// ExecutionContext::states), with a fake backend that finishes batches on its own thread the way
// the NCCL backend does -- so the path is exercised on machines without a GPU: every callback
// runs exactly once, names are released for reuse, batches still in flight when the executor is
// destroyed are completed by the backend state's destructor.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/executor.h"
#include "core/tensor_queue.h"

namespace hvdc {
namespace {

// Completes batches on a thread of its own, after `delay`.
class AsyncState : public BackendState {
 public:
  AsyncState(std::function<void(Batch&, const Status&)> complete, std::chrono::milliseconds delay)
      : complete_(std::move(complete)), delay_(delay), thread_([this] { Loop(); }) {}
  ~AsyncState() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Add(Batch b) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(std::move(b));
    }
    cv_.notify_all();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;
      Batch b = std::move(pending_.front());
      pending_.pop_front();
      lock.unlock();
      std::this_thread::sleep_for(delay_);
      complete_(b, Status::OK());
      lock.lock();
    }
  }

  std::function<void(Batch&, const Status&)> complete_;
  std::chrono::milliseconds delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> pending_;
  bool stopping_ = false;
  std::thread thread_;
};

class AsyncBackend : public Backend {
 public:
  explicit AsyncBackend(std::chrono::milliseconds delay) : delay_(delay) {}
  const char* name() const override { return "async-fake"; }
  bool Accepts(const Batch& batch) const override { return batch.device >= 0; }
  Status Execute(Batch& batch, ExecutionContext& ctx) override {
    if (!ctx.complete) return Status::UnknownError("the executor offers no async completion");
    auto& slot = ctx.states[this];
    if (!slot) slot = std::make_unique<AsyncState>(ctx.complete, delay_);
    Batch mine;
    mine.items.resize(batch.items.size());
    for (size_t i = 0; i < batch.items.size(); ++i) {
      mine.items[i].entry = std::move(batch.items[i].entry);
    }
    static_cast<AsyncState*>(slot.get())->Add(std::move(mine));
    ++executed;
    return Status::OK();
  }
  std::atomic<int> executed{0};

 private:
  std::chrono::milliseconds delay_;
};

struct Calls {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> count;  // callbacks per tensor
  explicit Calls(size_t n) : count(n, 0) {}
  bool WaitAll(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, limit, [&] {
      for (int c : count) {
        if (c == 0) return false;
      }
      return true;
    });
  }
};

std::shared_ptr<TensorEntry> Entry(const std::string& name, Calls* calls, int index) {
  auto e = NewEntry([calls, index](const Status& s) {
    EXPECT_TRUE(s.ok()) << s.message();
    std::lock_guard<std::mutex> lock(calls->mu);
    ++calls->count[static_cast<size_t>(index)];
    calls->cv.notify_all();
  });
  e->request.name = name;
  return e;
}

Batch DeviceBatch(std::vector<std::shared_ptr<TensorEntry>> entries) {
  Batch b;
  b.device = 0;
  for (auto& e : entries) {
    BatchItem item;
    auto response = std::make_shared<Response>();
    response->name = e->request.name;
    item.response = std::move(response);
    item.entry = std::move(e);
    b.items.push_back(std::move(item));
  }
  return b;
}

TEST(BackendAsync, CompletesOnceAndReleasesNames) {
  Config config;
  TensorQueue queue;
  AsyncBackend backend(std::chrono::milliseconds(2));
  Calls calls(40);
  {
    Executor ex(0, config, nullptr, nullptr, {&backend}, &queue, nullptr, /*threaded=*/true);
    std::vector<Batch> batches;
    for (int i = 0; i < 40; i += 4) {
      std::vector<std::shared_ptr<TensorEntry>> group;
      for (int k = i; k < i + 4; ++k) group.push_back(Entry("t" + std::to_string(k), &calls, k));
      ASSERT_TRUE(queue.Push(group).ok());
      queue.Drain();
      batches.push_back(DeviceBatch(group));
    }
    ex.Submit(std::move(batches));
    ASSERT_TRUE(calls.WaitAll(std::chrono::seconds(30)));
    // Completed names may be enqueued again.
    Calls again(1);
    EXPECT_TRUE(queue.Push({Entry("t0", &again, 0)}).ok());
  }
  EXPECT_EQ(backend.executed.load(), 10);
  for (int c : calls.count) EXPECT_EQ(c, 1);
}

// Destroying the executor while the backend still holds batches: the state's destructor (run
// before the executor's own members go) completes them.
TEST(BackendAsync, InFlightAtDestructionStillCompleteOnce) {
  Config config;
  TensorQueue queue;
  AsyncBackend backend(std::chrono::milliseconds(20));
  Calls calls(8);
  {
    Executor ex(0, config, nullptr, nullptr, {&backend}, &queue, nullptr, /*threaded=*/true);
    std::vector<Batch> batches;
    for (int k = 0; k < 8; ++k) {
      auto e = Entry("u" + std::to_string(k), &calls, k);
      ASSERT_TRUE(queue.Push({e}).ok());
      batches.push_back(DeviceBatch({e}));
    }
    queue.Drain();
    ex.Submit(std::move(batches));
  }  // ~Executor: Stop() runs every batch (queued on the fake), then the state drains
  ASSERT_TRUE(calls.WaitAll(std::chrono::seconds(1)));
  for (int c : calls.count) EXPECT_EQ(c, 1);
}

// Completes its batch from inside Execute (as the NCCL backend does for tensors with a
// done_stream), then stays in Execute until released.
class EarlyBackend : public Backend {
 public:
  const char* name() const override { return "early-fake"; }
  bool Accepts(const Batch& batch) const override { return batch.device >= 0; }
  Status Execute(Batch& batch, ExecutionContext& ctx) override {
    Batch mine;
    mine.items.resize(batch.items.size());
    for (size_t i = 0; i < batch.items.size(); ++i) {
      mine.items[i].entry = std::move(batch.items[i].entry);
    }
    ctx.complete(mine, Status::OK());
    std::unique_lock<std::mutex> lock(mu);
    inside = true;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
    inside = false;
    left = true;
    cv.notify_all();
    return Status::OK();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool inside = false;
  bool released = false;
  bool left = false;
};

// Items completed inside Execute are no longer the executor's: abandoning it while Execute is
// still running must not complete them (or release their names) again.
TEST(BackendAsync, CompletedInsideExecuteThenAbandonedCompleteOnce) {
  Config config;
  TensorQueue queue;
  EarlyBackend backend;
  Calls calls(3);
  {
    Executor ex(0, config, nullptr, nullptr, {&backend}, &queue, nullptr, /*threaded=*/true);
    std::vector<std::shared_ptr<TensorEntry>> group;
    for (int k = 0; k < 3; ++k) group.push_back(Entry("e" + std::to_string(k), &calls, k));
    ASSERT_TRUE(queue.Push(group).ok());
    queue.Drain();
    std::vector<Batch> batches;
    batches.push_back(DeviceBatch(group));
    ex.Submit(std::move(batches));
    {
      std::unique_lock<std::mutex> lock(backend.mu);
      ASSERT_TRUE(
          backend.cv.wait_for(lock, std::chrono::seconds(30), [&] { return backend.inside; }));
    }
    ASSERT_TRUE(calls.WaitAll(std::chrono::seconds(30)));
    // Their names are free again: a new tensor takes one, and abandoning must not release it.
    Calls reused(1);
    ASSERT_TRUE(queue.Push({Entry("e0", &reused, 0)}).ok());
    ex.Abandon(Status::Aborted("abandoned by the test"));
    Calls third(1);
    EXPECT_FALSE(queue.Push({Entry("e0", &third, 0)}).ok())
        << "Abandon() released the name of an item completed before it";
    {
      std::unique_lock<std::mutex> lock(backend.mu);
      backend.released = true;
      backend.cv.notify_all();
      // The detached thread still runs Execute: wait until it has left `backend`.
      ASSERT_TRUE(
          backend.cv.wait_for(lock, std::chrono::seconds(30), [&] { return backend.left; }));
    }
  }
  for (int c : calls.count) EXPECT_EQ(c, 1);
}

}  // namespace
}  // namespace hvdc

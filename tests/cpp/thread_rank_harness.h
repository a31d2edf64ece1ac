// The thread-rank harness: N ranks as N threads of one process, each with its own Runtime over an
// in-memory world (local_controller/), so negotiation, fusion, the cache, join and errors can be
// tested for many world sizes without MPI.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/runtime.h"
#include "local_controller/local_world.h"
#include "ops/cpu/host_backend.h"

namespace hvdc {
namespace testing {

class ThreadWorld {
 public:
  ThreadWorld(int size, Config config, std::vector<std::vector<int>> extra_sets = {})
      : size_(size), config_(std::move(config)), backend_(MakeHostBackend()) {
    world_ = LocalWorld::Create(size, std::chrono::milliseconds(60000));
    runtimes_.resize(size);
    std::vector<Status> status(size);
    OnAllRanks([&](int r) {
      std::unique_ptr<Runtime> rt;
      status[r] = Runtime::Create(config_, MakeLocalTransport(world_, r), {backend_.get()},
                                  extra_sets, &rt);
      runtimes_[r] = std::move(rt);
    });
    for (auto& s : status) init_status_ = s.ok() ? init_status_ : s;
  }
  ~ThreadWorld() { Shutdown(); }

  const Status& init_status() const { return init_status_; }
  int size() const { return size_; }
  Runtime& rt(int rank) { return *runtimes_[rank]; }

  // Runs fn(rank) on one thread per rank and waits for all.
  void OnAllRanks(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) threads.emplace_back(fn, r);
    for (auto& t : threads) t.join();
  }

  void Shutdown() {
    OnAllRanks([&](int r) {
      if (runtimes_[r]) runtimes_[r]->Shutdown();
    });
    runtimes_.clear();
    runtimes_.resize(size_);
  }

 private:
  int size_;
  Config config_;
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<LocalWorld> world_;
  std::vector<std::unique_ptr<Runtime>> runtimes_;
  Status init_status_;
};

// Enqueues and returns a future for the completion status (or the enqueue error).
inline std::future<Status> Submit(Runtime& rt, int set, std::vector<EnqueueItem> items) {
  auto promise = std::make_shared<std::promise<Status>>();
  auto future = promise->get_future();
  Status s =
      rt.Enqueue(set, std::move(items), [promise](const Status& st) { promise->set_value(st); });
  if (!s.ok()) promise->set_value(s);
  return future;
}

inline EnqueueItem AllreduceItem(const std::string& name, const float* in, float* out,
                                 int64_t count, ReduceOp op = ReduceOp::kSum, double pre = 1.0,
                                 double post = 1.0) {
  EnqueueItem item;
  item.request.op = OpType::kAllreduce;
  item.request.dtype = DataType::kFloat32;
  item.request.name = name;
  item.request.shape = {count};
  item.request.reduce_op = op;
  item.request.prescale = pre;
  item.request.postscale = post;
  item.input = in;
  item.output = out;
  return item;
}

}  // namespace testing
}  // namespace hvdc

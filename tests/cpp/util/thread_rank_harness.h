// The thread-rank harness: N ranks as N threads of one process, each with its own Runtime over an
// in-memory world (local_controller/), so negotiation, fusion, the cache, join, process sets and
// errors can be tested for many world sizes without MPI.
//
//   ThreadWorld world(3, SmallConfig());              // the plain world
//   WorldOptions o;                                   // or any of the options below
//   o.size = 3;
//   o.threads = false;                                // executor inline (MPI_THREAD_SERIALIZED)
//   o.gates.resize(3);
//   o.gates[0][{0, 1}] = hold;                        // rank 0's view of set {0, 1}'s rounds
//   ThreadWorld gated(o);
//
// Every wait in a test is bounded. A world whose ranks do not shut down within a limit is leaked
// (never destroyed): a test demonstrating a hang fails instead of hanging the binary.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/process_set_error.h"
#include "core/runtime.h"
#include "local_controller/local_world.h"
#include "ops/cpu/host_backend.h"

namespace hvdc {
namespace testing {

using Hold = std::shared_ptr<std::atomic<bool>>;

// How long a test waits for something that normally takes milliseconds.
constexpr std::chrono::seconds kWait{15};

// Small buffers, so a few tensors make several fused batches, zero-copy and chunked reductions.
inline Config SmallConfig() {
  Config c;
  c.fusion_threshold_bytes = 4096;
  c.zero_copy_bytes = 2048;
  c.chunk_bytes = 1024;
  c.cache_capacity = 16;
  return c;
}

struct WorldOptions {
  int size = 1;
  Config config;                // every rank's Config ...
  std::vector<Config> configs;  // ... unless one per rank is given here (then size entries)
  std::vector<std::vector<int>> extra_sets;  // process sets created at init (ids 1, 2, ...)
  // false: the transport reports MPI_THREAD_SERIALIZED (executor inline on the control thread).
  bool threads = true;
  std::chrono::milliseconds arrival_timeout{60000};  // the in-memory world's wait for peers
  // Gates, per rank: set ranks -> flag. While the flag is set, that rank never sees a round of
  // that set complete (its part is deposited; the peers' rounds proceed) -- a round completing
  // later on one rank than on another, as MPI nonblocking collectives do.
  std::vector<std::map<std::vector<int>, Hold>> gates;
};

namespace internal {

class GatedOp : public PendingOp {
 public:
  GatedOp(std::unique_ptr<PendingOp> inner, Hold hold)
      : inner_(std::move(inner)), hold_(std::move(hold)) {}
  bool Test(Status* status) override {
    if (hold_->load()) return false;
    return inner_->Test(status);
  }
  bool Missing(std::vector<int>* ranks) const override { return inner_->Missing(ranks); }

 private:
  std::unique_ptr<PendingOp> inner_;
  Hold hold_;
};

class GatedChannel : public ControlChannel {
 public:
  GatedChannel(std::unique_ptr<ControlChannel> inner, Hold hold)
      : inner_(std::move(inner)), hold_(std::move(hold)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::unique_ptr<PendingOp> StartBitAnd(std::vector<uint64_t>* bits) override {
    return std::make_unique<GatedOp>(inner_->StartBitAnd(bits), hold_);
  }
  std::unique_ptr<PendingOp> StartGather(std::string send,
                                         std::vector<std::string>* gathered) override {
    return std::make_unique<GatedOp>(inner_->StartGather(std::move(send), gathered), hold_);
  }
  std::unique_ptr<PendingOp> StartBroadcast(std::string* blob) override {
    return std::make_unique<GatedOp>(inner_->StartBroadcast(blob), hold_);
  }

 private:
  std::unique_ptr<ControlChannel> inner_;
  Hold hold_;
};

// The in-memory transport with the options applied: the thread level it reports, and gated
// control channels for the sets named in `gates`.
class HarnessTransport : public Transport {
 public:
  HarnessTransport(std::unique_ptr<Transport> inner, bool threads,
                   std::map<std::vector<int>, Hold> gates)
      : inner_(std::move(inner)), threads_(threads), gates_(std::move(gates)) {}
  const Topology& topology() const override { return inner_->topology(); }
  const char* name() const override { return inner_->name(); }
  bool threads_supported() const override { return threads_; }
  Status CreateProcessSet(const std::vector<int>& world_ranks, ProcessSetChannels* out) override {
    HVDC_RETURN_IF_ERROR(inner_->CreateProcessSet(world_ranks, out));
    auto it = gates_.find(world_ranks);
    if (it != gates_.end() && out->control) {
      out->control = std::make_unique<GatedChannel>(std::move(out->control), it->second);
    }
    return Status::OK();
  }
  Status CheckAgreement(uint64_t value, bool* all_equal) override {
    return inner_->CheckAgreement(value, all_equal);
  }
  void Finalize() override { inner_->Finalize(); }

 private:
  std::unique_ptr<Transport> inner_;
  bool threads_;
  std::map<std::vector<int>, Hold> gates_;
};

}  // namespace internal

// Runs fn on a detached thread; the future carries its result. Whatever fn touches must outlive
// it (tests that may leave such a thread stuck leak what it uses).
template <typename T>
std::future<T> Detached(std::function<T()> fn) {
  auto p = std::make_shared<std::promise<T>>();
  auto f = p->get_future();
  std::thread([p, fn = std::move(fn)] { p->set_value(fn()); }).detach();
  return f;
}

class ThreadWorld {
 public:
  using Clock = std::chrono::steady_clock;

  ThreadWorld(int size, Config config, std::vector<std::vector<int>> extra_sets = {})
      : ThreadWorld(Options(size, std::move(config), std::move(extra_sets))) {}

  explicit ThreadWorld(WorldOptions o) : size_(o.size), backend_(MakeHostBackend()) {
    if (!o.configs.empty() && static_cast<int>(o.configs.size()) != size_) {
      init_status_ = Status::InvalidArgument("WorldOptions: configs must have one per rank");
      return;
    }
    world_ = LocalWorld::Create(size_, o.arrival_timeout);
    runtimes_.resize(size_);
    std::vector<Status> status(size_);
    OnAllRanks([&](int r) {
      std::map<std::vector<int>, Hold> gates;
      if (r < static_cast<int>(o.gates.size())) gates = o.gates[r];
      auto t = std::make_unique<internal::HarnessTransport>(MakeLocalTransport(world_, r),
                                                            o.threads, std::move(gates));
      const Config& config = o.configs.empty() ? o.config : o.configs[r];
      status[r] =
          Runtime::Create(config, std::move(t), {backend_.get()}, o.extra_sets, &runtimes_[r]);
    });
    for (auto& s : status) init_status_ = s.ok() ? init_status_ : s;
  }
  ~ThreadWorld() {
    if (!Shutdown()) ADD_FAILURE() << "a rank's Runtime did not shut down within 40 s (leaked)";
  }
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  const Status& init_status() const { return init_status_; }
  int size() const { return size_; }
  Runtime& rt(int rank) { return *runtimes_[rank]; }
  // Destroys one rank's Runtime (after its Shutdown).
  void Destroy(int rank) { runtimes_[rank].reset(); }

  // Runs fn(rank) on one thread per rank and waits for all.
  void OnAllRanks(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) threads.emplace_back(fn, r);
    for (auto& t : threads) t.join();
  }

  // Shuts every rank down concurrently and destroys the runtimes. False when one does not return
  // within `limit`: then everything is leaked (threads may be stuck inside for good).
  bool Shutdown(Clock::duration limit = std::chrono::seconds(40)) {
    if (leaked_) return true;
    std::vector<std::future<int>> done;
    for (auto& owned : runtimes_) {
      Runtime* rt = owned.get();
      if (!rt) continue;
      done.push_back(Detached<int>([rt] { return rt->Shutdown().ok() ? 0 : 1; }));
    }
    const auto deadline = Clock::now() + limit;
    for (auto& f : done) {
      if (f.wait_until(deadline) != std::future_status::ready) {
        Leak();
        return false;
      }
    }
    runtimes_.clear();
    runtimes_.resize(size_);
    return true;
  }

  // Never destroys these runtimes, the backend or the world (a thread may be stuck inside).
  void Leak() {
    leaked_ = true;
    for (auto& rt : runtimes_) (void)rt.release();
    (void)backend_.release();
    (void)new std::shared_ptr<LocalWorld>(world_);
  }

 private:
  static WorldOptions Options(int size, Config config, std::vector<std::vector<int>> extra_sets) {
    WorldOptions o;
    o.size = size;
    o.config = std::move(config);
    o.extra_sets = std::move(extra_sets);
    return o;
  }

  int size_;
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<LocalWorld> world_;
  std::vector<std::unique_ptr<Runtime>> runtimes_;
  Status init_status_;
  bool leaked_ = false;
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

// Whether the future is ready within `d`.
inline bool ReadyWithin(std::future<Status>& f, std::chrono::steady_clock::duration d = kWait) {
  return f.wait_for(d) == std::future_status::ready;
}

inline std::vector<EnqueueItem> One(EnqueueItem item) {
  std::vector<EnqueueItem> v;
  v.push_back(std::move(item));
  return v;
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

inline EnqueueItem JoinItem(int32_t* last) {
  EnqueueItem j;
  j.request.op = OpType::kJoin;
  j.join_last_rank = last;
  return j;
}

inline EnqueueItem BarrierItem(const std::string& name) {
  EnqueueItem b;
  b.request.op = OpType::kBarrier;
  b.request.name = name;
  return b;
}

inline EnqueueItem BroadcastItem(const std::string& name, float* buf, int64_t count, int root) {
  EnqueueItem b;
  b.request.op = OpType::kBroadcast;
  b.request.dtype = DataType::kFloat32;
  b.request.name = name;
  b.request.shape = {count};
  b.request.root_rank = root;
  b.input = buf;
  b.output = buf;
  return b;
}

// The process-set calls as the tests read them: the id / size / 0-or-1 on success, else
// Code(why) (a negative number).
inline int Code(ProcessSetError why) { return -static_cast<int>(why); }
inline int Code(const Status& s) { return s.ok() ? 0 : Code(ProcessSetErrorOf(s)); }
inline int AddSet(Runtime& rt, std::vector<int> ranks) {
  int id = 0;
  Status s = rt.AddProcessSet(std::move(ranks), &id);
  return s.ok() ? id : Code(s);
}
inline int RemoveSet(Runtime& rt, int id) { return Code(rt.RemoveProcessSet(id)); }
inline int SetSize(const Runtime& rt, int id) {
  int size = 0;
  Status s = rt.ProcessSetSize(id, &size);
  return s.ok() ? size : Code(s);
}
inline int SetIncluded(const Runtime& rt, int id) {
  bool included = false;
  Status s = rt.ProcessSetIncluded(id, &included);
  return s.ok() ? (included ? 1 : 0) : Code(s);
}

}  // namespace testing
}  // namespace hvdc

// Review tests for the negotiation and execution core (controller, message table, response cache,
// runtime control thread, executor, planner), with ranks as threads. Each test is bounded: a
// deadlock shows up as a failed wait_for, never as a hang of the binary. Tests whose scenario can
// leave a thread stuck forever (a bug they demonstrate) leak that world instead of destroying it.
//
// Some tests need interleavings the plain harness cannot force; they use TestWorld below, which
// wraps the in-memory transport to (a) hold back one rank's view of one process set's control
// rounds ("gates", modelling a round that completes later on one rank than on another, as MPI
// nonblocking collectives do), (b) report MPI_THREAD_SERIALIZED (executor inline on the control
// thread), and (c) give each rank its own Config.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "core/c_api.h"
#include "tests/cpp/thread_rank_harness.h"

namespace hvdc {
namespace testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kWait = std::chrono::seconds(15);  // normal completion takes milliseconds

Config SmallConfig() {
  Config c;
  c.fusion_threshold_bytes = 4096;
  c.zero_copy_bytes = 2048;
  c.chunk_bytes = 1024;
  c.cache_capacity = 16;
  return c;
}

std::vector<EnqueueItem> One(EnqueueItem item) {
  std::vector<EnqueueItem> v;
  v.push_back(std::move(item));
  return v;
}

EnqueueItem JoinItem(int32_t* last) {
  EnqueueItem j;
  j.request.op = OpType::kJoin;
  j.join_last_rank = last;
  return j;
}

EnqueueItem BarrierItem(const std::string& name) {
  EnqueueItem b;
  b.request.op = OpType::kBarrier;
  b.request.name = name;
  return b;
}

EnqueueItem BroadcastItem(const std::string& name, float* buf, int64_t count, int root) {
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

bool ReadyWithin(std::future<Status>& f, Clock::duration d = kWait) {
  return f.wait_for(d) == std::future_status::ready;
}

// Runs fn on a detached thread; the future carries its result. Whatever fn touches must outlive
// it (tests that may leave such a thread stuck leak what it uses).
template <typename T>
std::future<T> Detached(std::function<T()> fn) {
  auto p = std::make_shared<std::promise<T>>();
  auto f = p->get_future();
  std::thread([p, fn = std::move(fn)] { p->set_value(fn()); }).detach();
  return f;
}

// ---- A configurable world: gates, serialized execution, per-rank configs. ----

using Hold = std::shared_ptr<std::atomic<bool>>;

class GatedOp : public PendingOp {
 public:
  GatedOp(std::unique_ptr<PendingOp> inner, Hold hold)
      : inner_(std::move(inner)), hold_(std::move(hold)) {}
  bool Test(Status* status) override {
    if (hold_->load()) return false;
    return inner_->Test(status);
  }

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

class TestTransport : public Transport {
 public:
  TestTransport(std::unique_ptr<Transport> inner, bool threads,
                std::map<std::vector<int>, Hold> gates)
      : inner_(std::move(inner)), threads_(threads), gates_(std::move(gates)) {}
  const Topology& topology() const override { return inner_->topology(); }
  const char* name() const override { return inner_->name(); }
  bool is_mpi() const override { return false; }
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

struct WorldOptions {
  std::vector<Config> configs;  // one per rank
  std::vector<std::vector<int>> extra_sets;
  bool threads = true;
  std::chrono::milliseconds arrival_timeout{60000};
  std::vector<std::map<std::vector<int>, Hold>> gates;  // per rank: set ranks -> hold flag
};

class TestWorld {
 public:
  explicit TestWorld(WorldOptions o)
      : size_(static_cast<int>(o.configs.size())), backend_(MakeHostBackend()) {
    world_ = LocalWorld::Create(size_, o.arrival_timeout);
    runtimes_.resize(size_);
    std::vector<Status> status(size_);
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([&, r] {
        std::map<std::vector<int>, Hold> gates;
        if (r < static_cast<int>(o.gates.size())) gates = o.gates[r];
        auto t = std::make_unique<TestTransport>(MakeLocalTransport(world_, r), o.threads, gates);
        status[r] = Runtime::Create(o.configs[r], std::move(t), {backend_.get()}, o.extra_sets,
                                    &runtimes_[r]);
      });
    }
    for (auto& t : threads) t.join();
    for (auto& s : status) init_status_ = s.ok() ? init_status_ : s;
  }
  ~TestWorld() {
    if (!ShutdownAll()) Leak();
  }

  const Status& init_status() const { return init_status_; }
  Runtime& rt(int r) { return *runtimes_[r]; }
  void Destroy(int r) { runtimes_[r].reset(); }

  void OnAllRanks(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) threads.emplace_back(fn, r);
    for (auto& t : threads) t.join();
  }

  // Shuts every rank down concurrently; false (and everything leaked) if one does not return.
  bool ShutdownAll(Clock::duration limit = 40s) {
    if (leaked_) return true;
    std::vector<std::future<int>> done;
    for (int r = 0; r < size_; ++r) {
      Runtime* rt = runtimes_[r].get();
      if (!rt) continue;
      done.push_back(Detached<int>([rt] {
        rt->Shutdown();
        return 0;
      }));
    }
    const auto deadline = Clock::now() + limit;
    for (auto& f : done) {
      if (f.wait_until(deadline) != std::future_status::ready) {
        Leak();
        return false;
      }
    }
    runtimes_.clear();
    return true;
  }

  // Threads may be stuck inside these runtimes for good: never destroy them.
  void Leak() {
    leaked_ = true;
    for (auto& rt : runtimes_) (void)rt.release();
    (void)backend_.release();
    (void)new std::shared_ptr<LocalWorld>(world_);
  }

 private:
  int size_;
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<LocalWorld> world_;
  std::vector<std::unique_ptr<Runtime>> runtimes_;
  Status init_status_;
  bool leaked_ = false;
};

// =====================================================================================
// Grouped collectives and the response cache.
// =====================================================================================

// Runs a group of allreduces twice on every rank: `counts1` then `counts2`; each must complete
// within kWait with the sum over ranks.
void RunGroupTwice(int n, Config config, const std::vector<int64_t>& counts1,
                   const std::vector<int64_t>& counts2) {
  ThreadWorld world(n, config);
  ASSERT_TRUE(world.init_status().ok());
  world.OnAllRanks([&](int r) {
    for (const auto* counts : {&counts1, &counts2}) {
      const size_t m = counts->size();
      auto in = std::make_shared<std::vector<std::vector<float>>>(m);
      std::vector<EnqueueItem> items;
      for (size_t i = 0; i < m; ++i) {
        (*in)[i].assign((*counts)[i], static_cast<float>(r + 1));
        items.push_back(AllreduceItem("grp_" + std::to_string(i), (*in)[i].data(), (*in)[i].data(),
                                      (*counts)[i]));
      }
      auto f = Submit(world.rt(r), 0, std::move(items));
      const bool ready = ReadyWithin(f);
      EXPECT_TRUE(ready) << "rank " << r << ": the grouped allreduce (" << m
                         << " members) never completed";
      if (!ready) {
        // Keep the buffers alive: the entries are failed at shutdown (no data is touched then).
        (void)new std::shared_ptr<std::vector<std::vector<float>>>(in);
        return;
      }
      Status s = f.get();
      EXPECT_TRUE(s.ok()) << s.ToString();
      for (size_t i = 0; i < m; ++i) {
        if (!(*in)[i].empty()) {
          EXPECT_EQ((*in)[i][0], static_cast<float>(n * (n + 1) / 2));
        }
      }
    }
  });
}

// A cache smaller than the group: Put of the group's own members evicts the first ones, so the
// second step finds some members cached (ready through the bit vector) and the others not (sent in
// full). The coordinator holds full members back until the whole group is ready in its table --
// which never happens, since the cached members never reach the table.
TEST(ThreadRankReviewGroups, GroupWithSomeMembersEvictedFromTheCacheCompletes) {
  Config c = SmallConfig();
  c.cache_capacity = 3;
  RunGroupTwice(2, c, {4, 4, 4, 4, 4}, {4, 4, 4, 4, 4});
}

// The same with the default cache: one member changes shape between steps (dynamic shapes), so
// its cache entry is invalidated and it is renegotiated in full while the other member completes
// from the cache.
TEST(ThreadRankReviewGroups, GroupWhoseMemberChangesShapeCompletes) {
  RunGroupTwice(2, SmallConfig(), {4, 4}, {4, 6});
}

// Regression/contrast: with the response cache disabled the same shape change completes (every
// member is negotiated in full, so the coordinator sees the whole group).
TEST(ThreadRankReviewGroups, GroupWhoseMemberChangesShapeWithoutCacheCompletes) {
  Config c = SmallConfig();
  c.cache_capacity = 0;
  RunGroupTwice(2, c, {4, 4}, {4, 6});
}

// Regression: a group repeated with an unchanged cache completes every time.
TEST(ThreadRankReviewGroups, RepeatedGroupFullyCachedCompletes) {
  RunGroupTwice(3, SmallConfig(), {4, 700, 4}, {4, 700, 4});
}

// =====================================================================================
// Join.
// =====================================================================================

// Rank 0 enqueues allreduce "x" and then join, both while its executor is busy (so both are in the
// same round); rank 1 only joins. "x" must complete with rank 1 contributing zeros, then join.
// When "x" was negotiated before (it travels as a cache bit), the round in which every rank has
// joined skips the cached-ready bits (kFlagJoined) and emits join; "x" is then never ready again
// (rank 1 no longer joined, and it never submits "x").
void JoinWithPendingAllreduce(bool cached) {
  Config c = SmallConfig();
  c.cycle_time_ms = 2000;  // rank 0 enters its next round only when its executor is idle
  const int n = 2;
  ThreadWorld world(n, c);
  ASSERT_TRUE(world.init_status().ok());
  const std::string x_name = cached ? "x" : "x_fresh";
  auto xbuf = std::make_shared<std::vector<std::vector<float>>>(n, std::vector<float>(8));
  if (cached) {
    world.OnAllRanks([&](int r) {
      (*xbuf)[r].assign(8, static_cast<float>(r + 1));
      Status s =
          Submit(world.rt(r), 0, One(AllreduceItem("x", (*xbuf)[r].data(), (*xbuf)[r].data(), 8)))
              .get();
      ASSERT_TRUE(s.ok()) << s.ToString();
    });
  }
  auto x_done = std::make_shared<std::promise<Status>>();
  auto join0_done = std::make_shared<std::promise<Status>>();
  auto last = std::make_shared<std::vector<int32_t>>(n, -1);
  auto x_future = x_done->get_future();
  auto join0_future = join0_done->get_future();
  world.OnAllRanks([&](int r) {
    Runtime& rt = world.rt(r);
    std::vector<float> w(4, 1.f);
    auto w_done = std::make_shared<std::promise<Status>>();
    auto w_future = w_done->get_future();
    Completion::Callback cb = [&rt, r, xbuf, x_done, join0_done, last, w_done,
                               x_name](const Status& s) {
      if (r == 0 && s.ok()) {
        (*xbuf)[0].assign(8, 10.f);
        Status e =
            rt.Enqueue(0, One(AllreduceItem(x_name, (*xbuf)[0].data(), (*xbuf)[0].data(), 8)),
                       [x_done](const Status& st) { x_done->set_value(st); });
        if (!e.ok()) x_done->set_value(e);
        e = rt.Enqueue(0, One(JoinItem(&(*last)[0])),
                       [join0_done](const Status& st) { join0_done->set_value(st); });
        if (!e.ok()) join0_done->set_value(e);
        std::this_thread::sleep_for(200ms);
      }
      w_done->set_value(s);
    };
    ASSERT_TRUE(rt.Enqueue(0, One(AllreduceItem("w", w.data(), w.data(), 4)), cb).ok());
    ASSERT_TRUE(w_future.get().ok());
    if (r == 1) {
      auto j = Submit(rt, 0, One(JoinItem(&(*last)[1])));
      ASSERT_TRUE(ReadyWithin(j)) << "rank 1's join never completed";
      EXPECT_TRUE(j.get().ok());
    }
  });
  ASSERT_TRUE(ReadyWithin(join0_future)) << "rank 0's join never completed";
  EXPECT_TRUE(join0_future.get().ok());
  const bool x_ready = ReadyWithin(x_future);
  EXPECT_TRUE(x_ready) << "allreduce '" << x_name
                       << "' enqueued by rank 0 before its join never completed although every "
                          "other rank has joined (join already returned on both ranks)";
  if (x_ready) {
    Status s = x_future.get();
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ((*xbuf)[0][3], 10.f);  // rank 1 contributes zeros
  }
}

TEST(ThreadRankReviewJoin, JoinWithUncachedAllreducePendingCompletesIt) {
  JoinWithPendingAllreduce(false);
}

TEST(ThreadRankReviewJoin, JoinWithCachedAllreducePendingCompletesIt) {
  JoinWithPendingAllreduce(true);
}

// A joined rank sets the ready bit of every cached *allreduce* only. A barrier (which MergeRequests
// allows while a rank has joined) that was negotiated before travels as a cache bit, so it is
// never ready while a rank has joined: it waits until the stall inspector renegotiates it in full
// (stall_check_time/2 = 30 s by default; forever with HOROVOD_STALL_CHECK_DISABLE).
TEST(ThreadRankReviewJoin, CachedBarrierCompletesWhileARankHasJoined) {
  ThreadWorld world(2, SmallConfig());
  world.OnAllRanks([&](int r) {
    ASSERT_TRUE(Submit(world.rt(r), 0, One(BarrierItem("bar"))).get().ok());  // now cached
  });
  world.OnAllRanks([&](int r) {
    int32_t last = -1;
    if (r == 0) {
      auto j = Submit(world.rt(0), 0, One(JoinItem(&last)));
      ASSERT_TRUE(ReadyWithin(j, kWait + 10s));
      EXPECT_TRUE(j.get().ok());
      return;
    }
    std::this_thread::sleep_for(100ms);
    auto b = Submit(world.rt(1), 0, One(BarrierItem("bar")));
    const bool ready = ReadyWithin(b);
    EXPECT_TRUE(ready) << "a cached barrier never completed while rank 0 has joined";
    if (ready) {
      EXPECT_TRUE(b.get().ok());
    }
    auto j = Submit(world.rt(1), 0, One(JoinItem(&last)));
    ASSERT_TRUE(ReadyWithin(j));
    EXPECT_TRUE(j.get().ok());
  });
}

// The same for an op that is an error while a rank has joined: it should fail promptly (as it does
// when negotiated in full) rather than wait for the stall inspector.
TEST(ThreadRankReviewJoin, CachedBroadcastFailsPromptlyWhileARankHasJoined) {
  ThreadWorld world(2, SmallConfig());
  auto bufs = std::make_shared<std::vector<std::vector<float>>>(2, std::vector<float>(4, 1.f));
  world.OnAllRanks([&](int r) {
    ASSERT_TRUE(
        Submit(world.rt(r), 0, One(BroadcastItem("bc", (*bufs)[r].data(), 4, 1))).get().ok());
  });
  world.OnAllRanks([&](int r) {
    int32_t last = -1;
    if (r == 0) {
      auto j = Submit(world.rt(0), 0, One(JoinItem(&last)));
      ASSERT_TRUE(ReadyWithin(j, kWait + 10s));
      EXPECT_TRUE(j.get().ok());
      return;
    }
    std::this_thread::sleep_for(100ms);
    auto b = Submit(world.rt(1), 0, One(BroadcastItem("bc", (*bufs)[1].data(), 4, 1)));
    const bool ready = ReadyWithin(b);
    EXPECT_TRUE(ready) << "a cached broadcast neither completed nor failed while rank 0 has joined";
    if (ready) {
      EXPECT_EQ(b.get().code(), StatusCode::kPreconditionError);
    }
    auto j = Submit(world.rt(1), 0, One(JoinItem(&last)));
    ASSERT_TRUE(ReadyWithin(j));
    EXPECT_TRUE(j.get().ok());
  });
}

// After a rank has joined it holds no tensor in pending_ (join_ is kept apart), so ShouldStart
// treats it as idle: it enters rounds only on the heartbeat (~1 s). Every round of the ranks still
// training needs it, so each of their collectives waits up to a second -- exactly when join is
// used (uneven data), the remaining steps run at about one collective per second.
TEST(ThreadRankReviewJoin, RanksStillTrainingAfterAJoinAreNotThrottledByTheHeartbeat) {
  ThreadWorld world(2, SmallConfig());
  ASSERT_TRUE(world.init_status().ok());
  world.OnAllRanks([&](int r) {
    int32_t last = -1;
    if (r == 0) {
      auto j = Submit(world.rt(0), 0, One(JoinItem(&last)));
      ASSERT_TRUE(ReadyWithin(j, kWait + 10s));
      EXPECT_TRUE(j.get().ok());
      return;
    }
    std::this_thread::sleep_for(200ms);  // rank 0's join has been negotiated
    const int kSteps = 8;
    const auto start = Clock::now();
    for (int step = 0; step < kSteps; ++step) {
      std::vector<float> buf(16, 1.f);
      auto f = Submit(
          world.rt(1), 0,
          One(AllreduceItem("after_join" + std::to_string(step % 2), buf.data(), buf.data(), 16)));
      ASSERT_TRUE(ReadyWithin(f));
      ASSERT_TRUE(f.get().ok());
      EXPECT_EQ(buf[0], 1.f);
    }
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_LT(took, 2.0) << kSteps << " allreduces took " << took
                         << " s while rank 0 had joined (each waited for its heartbeat)";
    auto j = Submit(world.rt(1), 0, One(JoinItem(&last)));
    ASSERT_TRUE(ReadyWithin(j));
    EXPECT_TRUE(j.get().ok());
  });
}

// Regression: a joined rank contributes zeros with the same chunking as the live ranks, for fused,
// zero-copy (chunked) and averaged allreduces with scale factors, cached and uncached.
TEST(ThreadRankReviewJoin, JoinedRankZerosMatchChunkingAndScaling) {
  const int n = 3;
  ThreadWorld world(n, SmallConfig());
  world.OnAllRanks([&](int r) {
    const int live_steps = r == 0 ? 0 : 2;
    for (int step = 0; step < live_steps; ++step) {
      std::vector<std::vector<float>> bufs;
      std::vector<std::future<Status>> done;
      const std::vector<int64_t> counts = {5, 300, 2000, 5000};
      bufs.reserve(counts.size());
      for (size_t t = 0; t < counts.size(); ++t) {
        bufs.emplace_back(counts[t], static_cast<float>(r));
        const ReduceOp op = t % 2 ? ReduceOp::kAverage : ReduceOp::kSum;
        done.push_back(Submit(world.rt(r), 0,
                              One(AllreduceItem("jz" + std::to_string(t), bufs[t].data(),
                                                bufs[t].data(), counts[t], op, 2.0, 0.5))));
      }
      for (size_t t = 0; t < counts.size(); ++t) {
        ASSERT_TRUE(ReadyWithin(done[t]));
        Status s = done[t].get();
        ASSERT_TRUE(s.ok()) << s.ToString();
        double expect = 0;
        for (int q = 1; q < n; ++q) expect += q * 2.0 * 0.5;
        if (t % 2) expect /= n;
        EXPECT_FLOAT_EQ(bufs[t].front(), static_cast<float>(expect)) << t;
        EXPECT_FLOAT_EQ(bufs[t].back(), static_cast<float>(expect)) << t;
      }
    }
    int32_t last = -1;
    auto j = Submit(world.rt(r), 0, One(JoinItem(&last)));
    ASSERT_TRUE(ReadyWithin(j));
    EXPECT_TRUE(j.get().ok());
    EXPECT_NE(last, 0);
  });
}

// =====================================================================================
// Dynamic process sets.
// =====================================================================================

// add_process_set must not block the control thread in a world collective until every rank calls
// it: rank 1 enqueues an allreduce and then calls add_process_set; rank 0 runs the same allreduce
// synchronously and only then calls add_process_set -- the same order of collectives on both
// ranks. The change is agreed in the global set's rounds (applied by every rank at the end of the
// same round), so rank 1's control thread keeps negotiating the allreduce meanwhile. (It used to
// run CheckAgreement on the control thread: the allreduce never completed, and with MPI nothing
// ever released it.)
TEST(ThreadRankReviewProcessSets, CollectiveInFlightDuringAddProcessSetCompletes) {
  Config c = SmallConfig();
  c.dynamic_process_sets = true;
  ThreadWorld world(2, c);
  ASSERT_TRUE(world.init_status().ok());
  world.OnAllRanks([&](int r) {
    std::vector<float> buf(16, static_cast<float>(r + 1));
    Runtime& rt = world.rt(r);
    if (r == 1) {
      auto f = Submit(rt, 0, One(AllreduceItem("before_add", buf.data(), buf.data(), 16)));
      const int id = rt.AddProcessSet({0});
      EXPECT_GT(id, 0);
      ASSERT_TRUE(ReadyWithin(f));
      EXPECT_TRUE(f.get().ok());
      return;
    }
    std::this_thread::sleep_for(300ms);
    auto f = Submit(rt, 0, One(AllreduceItem("before_add", buf.data(), buf.data(), 16)));
    const bool ready = ReadyWithin(f);
    EXPECT_TRUE(ready) << "an allreduce enqueued before add_process_set never completed: rank 1's "
                          "control thread is blocked inside add_process_set";
    const int id = rt.AddProcessSet({0});  // releases rank 1 in any case
    EXPECT_GT(id, 0);
    if (!ready) {
      ASSERT_TRUE(ReadyWithin(f));
    }
    EXPECT_TRUE(f.get().ok());
    EXPECT_EQ(buf[0], 3.f);
  });
}

// Regression: add a set, use it, remove it while a tensor is pending on it (that tensor fails once
// with the removal error), and the set is gone everywhere afterwards.
TEST(ThreadRankReviewProcessSets, AddUseRemoveWithPendingTensor) {
  Config c = SmallConfig();
  c.dynamic_process_sets = true;
  const int n = 3;
  ThreadWorld world(n, c);
  ASSERT_TRUE(world.init_status().ok());
  std::atomic<int> calls{0};
  auto pending_buf = std::make_shared<std::vector<float>>(4, 1.f);
  world.OnAllRanks([&](int r) {
    Runtime& rt = world.rt(r);
    const int id = rt.AddProcessSet({0, 2});
    ASSERT_EQ(id, 1);
    if (r != 1) {
      std::vector<float> buf(100, static_cast<float>(r + 1));
      auto f = Submit(rt, id, One(AllreduceItem("ps_t", buf.data(), buf.data(), 100)));
      ASSERT_TRUE(ReadyWithin(f));
      ASSERT_TRUE(f.get().ok());
      EXPECT_EQ(buf[99], 4.f);
    }
    std::future<Status> orphan;
    if (r == 0) {
      // Only rank 0 submits this one: it is pending when the set goes away.
      Status s =
          rt.Enqueue(id, One(AllreduceItem("orphan", pending_buf->data(), pending_buf->data(), 4)),
                     [&calls](const Status& st) {
                       calls++;
                       EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
                     });
      ASSERT_TRUE(s.ok());
      std::this_thread::sleep_for(50ms);
    }
    auto removed = Detached<int>([&rt, id] { return rt.RemoveProcessSet(id); });
    ASSERT_EQ(removed.wait_for(kWait), std::future_status::ready);
    EXPECT_EQ(removed.get(), 0);
    EXPECT_EQ(rt.ProcessSetSize(id), HVDC_PROCESS_SET_ERROR_UNKNOWN_SET);
    std::vector<float> x(1);
    EXPECT_EQ(
        rt.Enqueue(id, One(AllreduceItem("after", x.data(), x.data(), 1)), [](const Status&) {})
            .code(),
        StatusCode::kInvalidArgument);
  });
  EXPECT_EQ(calls.load(), 1);
}

// remove_process_set waits for the set's last round, then for `removed`. If the runtime starts
// shutting down (another rank's shutdown, a stall shutdown) before that round ends on this rank,
// HandleResult takes the shutdown branch, closes the set and never fulfils `removed`: the caller
// of remove_process_set blocks forever. Here rank 2 (not a member) removes the set and shuts down;
// rank 0's view of the set's last round is held back until its runtime has seen that shutdown.
TEST(ThreadRankReviewProcessSets, RemoveProcessSetReturnsWhenTheRuntimeShutsDownMeanwhile) {
  Config c;
  c.dynamic_process_sets = true;
  c.stall_check_time_s = 0.4;  // heartbeat 0.1 s: idle ranks join rounds quickly
  WorldOptions o;
  o.configs = {c, c, c};
  o.extra_sets = {{0, 1}};
  o.gates.resize(3);
  auto hold = std::make_shared<std::atomic<bool>>(false);
  o.gates[0][{0, 1}] = hold;
  auto* world = new TestWorld(o);
  ASSERT_TRUE(world->init_status().ok()) << world->init_status().ToString();
  hold->store(true);
  std::vector<std::future<int>> removed;
  for (int r = 0; r < 3; ++r) {
    removed.push_back(Detached<int>([world, r] {
      const int rc = world->rt(r).RemoveProcessSet(1);
      if (r == 2) world->rt(2).Shutdown();
      return rc;
    }));
  }
  // Wait until rank 0's runtime refuses work (it has begun shutting down).
  const auto deadline = Clock::now() + kWait;
  bool down = false;
  while (!down && Clock::now() < deadline) {
    down = world->rt(0).Enqueue(0, {}, [](const Status&) {}).code() == StatusCode::kUnknownError;
    if (!down) std::this_thread::sleep_for(10ms);
  }
  hold->store(false);
  ASSERT_TRUE(down) << "rank 0 never saw rank 2's shutdown";
  bool all = true;
  const auto wait_deadline = Clock::now() + kWait;
  for (int r = 0; r < 3; ++r) {
    const bool ready = removed[r].wait_until(wait_deadline) == std::future_status::ready;
    EXPECT_TRUE(ready) << "rank " << r << ": remove_process_set never returned";
    all &= ready;
    if (ready) {
      const int rc = removed[r].get();
      EXPECT_TRUE(rc == 0 || rc == HVDC_PROCESS_SET_ERROR_SHUTDOWN) << rc;
    }
  }
  if (!all) {
    world->Leak();  // threads are stuck inside RemoveProcessSet for good
    return;
  }
  delete world;
}

// After the set's last round, remove_process_set stops the set's executor on the caller's thread
// and then posts the final erase to the control thread (OnControlThread). If the runtime has
// finished in between (a peer's shutdown arrived while the executor was still completing a batch),
// the io_context is stopped, the posted task never runs and future.get() blocks forever. The same
// applies to any OnControlThread call racing with the end of the control thread. Here rank 0's
// executor is busy in a (slow) completion callback of the set when the removal starts, which
// widens the window; rank 2 (not a member) shuts down right after its removal.
TEST(ThreadRankReviewProcessSets,
     RemoveProcessSetReturnsWhenThePeerShutdownLandsDuringExecutorStop) {
  Config c;
  c.dynamic_process_sets = true;
  c.stall_check_time_s = 0.4;  // heartbeat 0.1 s
  WorldOptions o;
  o.configs = {c, c, c};
  o.extra_sets = {{0, 1}};
  auto* world = new TestWorld(o);
  ASSERT_TRUE(world->init_status().ok()) << world->init_status().ToString();
  auto bufs = new std::vector<std::vector<float>>(2, std::vector<float>(8, 1.f));
  auto started = std::make_shared<std::promise<void>>();
  auto started_future = started->get_future();
  for (int r = 0; r < 2; ++r) {
    Status s = world->rt(r).Enqueue(
        1, One(AllreduceItem("slow_cb", (*bufs)[r].data(), (*bufs)[r].data(), 8)),
        [r, started](const Status&) {
          if (r == 0) {
            started->set_value();
            std::this_thread::sleep_for(1500ms);
          }
        });
    ASSERT_TRUE(s.ok());
  }
  ASSERT_EQ(started_future.wait_for(kWait), std::future_status::ready);
  std::vector<std::future<int>> removed;
  for (int r = 0; r < 3; ++r) {
    removed.push_back(Detached<int>([world, r] {
      const int rc = world->rt(r).RemoveProcessSet(1);
      if (r == 2) world->rt(2).Shutdown();
      return rc;
    }));
  }
  bool all = true;
  const auto wait_deadline = Clock::now() + kWait;
  for (int r = 0; r < 3; ++r) {
    const bool ready = removed[r].wait_until(wait_deadline) == std::future_status::ready;
    EXPECT_TRUE(ready) << "rank " << r << ": remove_process_set never returned";
    all &= ready;
    if (ready) {
      const int rc = removed[r].get();
      EXPECT_TRUE(rc == 0 || rc == HVDC_PROCESS_SET_ERROR_SHUTDOWN) << rc;
    }
  }
  if (!all) {
    world->Leak();
    return;
  }
  delete world;
}

// A failed remove_process_set (ranks passed different ids) must leave the set removable: the
// retry calls get_future() on the set's promise a second time and throws std::future_error.
TEST(ThreadRankReviewProcessSets, RemoveProcessSetCanBeRetriedAfterADisagreement) {
  Config c = SmallConfig();
  c.dynamic_process_sets = true;
  ThreadWorld world(2, c, {{0}, {1}});  // ids 1 and 2
  ASSERT_TRUE(world.init_status().ok());
  world.OnAllRanks([&](int r) {
    Runtime& rt = world.rt(r);
    EXPECT_EQ(rt.RemoveProcessSet(r == 0 ? 1 : 2), HVDC_PROCESS_SET_ERROR_INIT);
    bool threw = false;
    int rc = -100;
    try {
      rc = rt.RemoveProcessSet(1);
    } catch (const std::exception& e) {
      threw = true;
      ADD_FAILURE() << "rank " << r << ": retrying remove_process_set threw: " << e.what();
    }
    if (threw) {
      // Pair up with the other rank's pending world collective so that it returns.
      rt.RemoveProcessSet(2);
      return;
    }
    EXPECT_TRUE(rc == 0 || rc == HVDC_PROCESS_SET_ERROR_INIT) << rc;
  });
}

// MergeRequests formats its mismatch message with indices into the process set (set ranks), but
// the message says "rank": in set {1, 2}, world rank 2's bad shape is reported as "rank 1".
TEST(ThreadRankReviewProcessSets, MismatchInAProcessSetNamesWorldRanks) {
  ThreadWorld world(3, SmallConfig(), {{1, 2}});
  ASSERT_TRUE(world.init_status().ok());
  world.OnAllRanks([&](int r) {
    if (r == 0) return;
    const int64_t count = r == 2 ? 4 : 3;
    std::vector<float> buf(count, 1.f);
    auto f = Submit(world.rt(r), 1, One(AllreduceItem("ps_bad", buf.data(), buf.data(), count)));
    ASSERT_TRUE(ReadyWithin(f));
    Status s = f.get();
    EXPECT_EQ(s.code(), StatusCode::kPreconditionError);
    EXPECT_NE(s.message().find("rank 1 has [3]"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("rank 2 has [4]"), std::string::npos) << s.message();
  });
}

// =====================================================================================
// Execution.
// =====================================================================================

// With MPI_THREAD_SERIALIZED the executor runs batches inline on the control thread, blocking it in
// a data collective until the peers run the same batch. Three overlapping sets A={0,1}, B={1,2},
// C={0,2}, one cached allreduce on each: when the rounds of a rank's two sets complete in the order
// C,A on rank 0, A,B on rank 1 and B,C on rank 2 (round completion order differs between ranks with
// nonblocking collectives; here it is forced by holding back each rank's view of its sets' rounds
// and releasing one set per rank first), rank 0 blocks in C waiting for rank 2, rank 2 in B waiting
// for rank 1 and rank 1 in A waiting for rank 0: a cycle no rank can leave, since the rounds that
// would unblock them need the blocked control threads. The in-memory data plane's 5-s arrival
// timeout turns the cycle into errors here; with MPI it is a hang. (DESIGN.md: "executes ready
// batches of different sets in ascending set id within a step, so overlapping sets cannot
// deadlock" -- not so when control and execution share one thread.)
void OverlappingSetsWithSkewedRounds(bool threads) {
  Config c = SmallConfig();
  WorldOptions o;
  o.configs = {c, c, c};
  o.extra_sets = {{0, 1}, {1, 2}, {0, 2}};  // ids 1 (A), 2 (B), 3 (C)
  o.threads = threads;
  o.arrival_timeout = 5000ms;
  o.gates.resize(3);
  const std::map<int, std::vector<int>> members = {{1, {0, 1}}, {2, {1, 2}}, {3, {0, 2}}};
  auto sets_of = [](int r) {
    return r == 0   ? std::vector<int>{1, 3}
           : r == 1 ? std::vector<int>{1, 2}
                    : std::vector<int>{2, 3};
  };
  const std::vector<int> first = {3, 1, 2};  // the set whose round each rank sees complete first
  std::vector<std::map<int, Hold>> holds(3);
  for (int r = 0; r < 3; ++r) {
    for (int set : sets_of(r)) {
      holds[r][set] = std::make_shared<std::atomic<bool>>(false);
      o.gates[r][members.at(set)] = holds[r][set];
    }
  }
  TestWorld world(o);
  ASSERT_TRUE(world.init_status().ok()) << world.init_status().ToString();
  // Warm the caches one set at a time (no cycle possible).
  world.OnAllRanks([&](int r) {
    for (int set : sets_of(r)) {
      std::vector<float> buf(8, 1.f);
      auto f = Submit(world.rt(r), set, One(AllreduceItem("cyc", buf.data(), buf.data(), 8)));
      ASSERT_TRUE(ReadyWithin(f));
      ASSERT_TRUE(f.get().ok());
    }
  });
  for (auto& per_rank : holds) {
    for (auto& [set, h] : per_rank) h->store(true);
  }
  std::thread release([&] {
    std::this_thread::sleep_for(300ms);  // every rank has started a round on both its sets
    for (int r = 0; r < 3; ++r) holds[r][first[r]]->store(false);
    std::this_thread::sleep_for(300ms);
    for (auto& per_rank : holds) {
      for (auto& [set, h] : per_rank) h->store(false);
    }
  });
  world.OnAllRanks([&](int r) {
    std::vector<std::vector<float>> bufs(2, std::vector<float>(8, 1.f));
    std::vector<std::future<Status>> done;
    auto sets = sets_of(r);
    for (int i = 0; i < 2; ++i) {
      done.push_back(Submit(world.rt(r), sets[i],
                            One(AllreduceItem("cyc", bufs[i].data(), bufs[i].data(), 8))));
    }
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(ReadyWithin(done[i]));
      Status s = done[i].get();
      EXPECT_TRUE(s.ok()) << "rank " << r << " set " << sets[i] << ": " << s.ToString();
      if (s.ok()) {
        EXPECT_EQ(bufs[i][0], 2.f);
      }
    }
  });
  release.join();
}

// With MPI_THREAD_SERIALIZED, batches of overlapping process sets run inline on the control
// thread; they must run in one order shared by every rank (Runtime::ReleaseHeld), not in the order
// each rank's rounds happen to complete.
TEST(ThreadRankReviewExecution, SerializedExecutionWithOverlappingSetsDoesNotDeadlock) {
  OverlappingSetsWithSkewedRounds(false);
}

// Regression: the same skew with an executor thread per set (MPI_THREAD_MULTIPLE) completes.
TEST(ThreadRankReviewExecution, ThreadedExecutionWithOverlappingSetsAndSkewedRoundsCompletes) {
  OverlappingSetsWithSkewedRounds(true);
}

// The planner runs on every rank with that rank's own Config. Ranks whose HOROVOD_FUSION_THRESHOLD
// (or HVDC_CHUNK_BYTES / zero-copy size) differ plan different batches for the same responses:
// here rank 0 fuses two tensors into one allreduce while rank 1 runs two -- the in-memory world
// reports the count mismatch; MPI would reduce the wrong bytes or hang. (Horovod fuses on the
// coordinator, so a differing threshold is harmless there.)
TEST(ThreadRankReviewExecution, RanksWithDifferentFusionSettingsAreRefusedAtInit) {
  Config a = SmallConfig();
  Config b = SmallConfig();
  b.fusion_threshold_bytes = 0;  // no fusion on rank 1
  WorldOptions o;
  o.configs = {a, b};
  o.arrival_timeout = 5000ms;
  TestWorld world(o);
  ASSERT_FALSE(world.init_status().ok());
  EXPECT_NE(world.init_status().message().find("HOROVOD_FUSION_THRESHOLD"), std::string::npos)
      << world.init_status().ToString();
}

// A local failure inside a batch (here: the framework's allocator returns null on one rank, as on
// an out-of-memory) makes HostBackend return before the collective on that rank only. The peers
// are inside the collective; the failing rank's *next* collective is matched with it. The data
// plane is desynchronized for good: in the in-memory world every later collective fails (kind
// mismatch, then missing ranks); with MPI an Allgatherv meets an Allreduce (undefined: hang or
// garbage).
TEST(ThreadRankReviewExecution, LocalAllocationFailureDoesNotDesynchronizeTheDataPlane) {
  Config c = SmallConfig();
  WorldOptions o;
  o.configs = {c, c};
  o.arrival_timeout = 5000ms;
  TestWorld world(o);
  ASSERT_TRUE(world.init_status().ok());
  world.OnAllRanks([&](int r) {
    std::vector<int32_t> in(3, r), out;
    EnqueueItem g;
    g.request.op = OpType::kAllgather;
    g.request.dtype = DataType::kInt32;
    g.request.name = "gather_oom";
    g.request.shape = {3};
    g.input = in.data();
    g.allocate = [&out, r](const Shape& shape) -> void* {
      if (r == 1) return nullptr;  // out of memory on rank 1 only
      out.resize(NumElements(shape));
      return out.data();
    };
    auto f = Submit(world.rt(r), 0, One(std::move(g)));
    ASSERT_TRUE(ReadyWithin(f));
    Status s = f.get();
    if (r == 1) {
      EXPECT_FALSE(s.ok());
    }
    // The next collective must work on both ranks.
    std::vector<float> buf(16, static_cast<float>(r + 1));
    auto f2 = Submit(world.rt(r), 0, One(AllreduceItem("after_oom", buf.data(), buf.data(), 16)));
    ASSERT_TRUE(ReadyWithin(f2));
    Status s2 = f2.get();
    EXPECT_TRUE(s2.ok()) << "rank " << r << ": " << s2.ToString();
    if (s2.ok()) {
      EXPECT_EQ(buf[0], 3.f);
    }
  });
}

// =====================================================================================
// Lifetime.
// =====================================================================================

// Runtime::Create failing after the control io_context exists (an invalid process set at init,
// a timeline that cannot be opened) destroys the Runtime, whose Shutdown() posts to an io_context
// that no thread runs and waits max(60 s, stall_shutdown + 10 s) for it.
TEST(ThreadRankReviewLifetime, InitWithAnInvalidProcessSetFailsPromptly) {
  auto world = LocalWorld::Create(1);
  std::shared_ptr<Backend> backend(MakeHostBackend());
  const auto start = Clock::now();
  auto f = Detached<Status>([world, backend] {
    std::unique_ptr<Runtime> rt;
    return Runtime::Create(Config(), MakeLocalTransport(world, 0), {backend.get()},
                           std::vector<std::vector<int>>{{0, 5}}, &rt);
  });
  const bool ready = f.wait_for(5s) == std::future_status::ready;
  EXPECT_TRUE(ready) << "Runtime::Create with an invalid process set did not return within 5 s";
  if (ready) {
    EXPECT_EQ(f.get().code(), StatusCode::kInvalidArgument);
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
  }
}

// After a peer stops responding, the runtime abandons it (round deadline) and Shutdown() leaves an
// executor that is stuck in a data collective behind. Shutdown() must fail that batch (and any
// queued one) itself, and the thread -- when the stuck collective eventually returns (the
// in-memory world's arrival timeout here; an MPI error with MPI_ERRORS_RETURN) -- must neither run
// a callback again nor touch the destroyed Runtime (its TensorQueue, Runtime::Wake, the Config,
// the Timeline). Run in a child process (death test) because a use-after-free may crash.
void AbandonedExecutorScenario() {
  Config c = SmallConfig();
  c.stall_check_time_s = 0.5;  // heartbeat 0.125 s
  c.stall_shutdown_time_s = 1.0;
  WorldOptions o;
  o.configs = {c, c};
  o.arrival_timeout = 5000ms;
  o.gates.resize(2);
  auto hold = std::make_shared<std::atomic<bool>>(false);
  o.gates[1][{0, 1}] = hold;
  auto* world = new TestWorld(o);  // leaked: the child exits with _Exit
  if (!world->init_status().ok()) std::_Exit(3);
  auto* bufs = new std::vector<std::vector<float>>(2, std::vector<float>(8, 1.f));
  world->OnAllRanks([&](int r) {  // "t" is now cached: the next round is one bit-vector AND
    if (!Submit(world->rt(r), 0, One(AllreduceItem("t", (*bufs)[r].data(), (*bufs)[r].data(), 8)))
             .get()
             .ok()) {
      std::_Exit(3);
    }
  });
  // Rank 1 "hangs": it deposits its part of every round but never sees one complete, so it never
  // executes the batch rank 0 runs, and never starts another round.
  hold->store(true);
  auto destroyed = std::make_shared<std::atomic<bool>>(false);
  auto late = std::make_shared<std::atomic<int>>(0);
  for (int r = 0; r < 2; ++r) {
    Status s =
        world->rt(r).Enqueue(0, One(AllreduceItem("t", (*bufs)[r].data(), (*bufs)[r].data(), 8)),
                             [destroyed, late](const Status&) {
                               if (destroyed->load()) late->fetch_add(1);
                             });
    if (!s.ok()) std::_Exit(3);
  }
  // Rank 0 abandons rank 1 after ~2 s (stall_shutdown + heartbeat + 1 s).
  const auto deadline = Clock::now() + 15s;
  bool down = false;
  while (!down && Clock::now() < deadline) {
    down = world->rt(0).Enqueue(0, {}, [](const Status&) {}).code() == StatusCode::kUnknownError;
    if (!down) std::this_thread::sleep_for(10ms);
  }
  if (!down) std::_Exit(4);
  world->rt(0).Shutdown();
  world->Destroy(0);
  destroyed->store(true);
  std::this_thread::sleep_for(6s);  // the stuck data collective gives up after 5 s
  if (late->load() != 0) {
    std::fprintf(stderr, "a callback ran after its Runtime was destroyed\n");
    std::_Exit(1);
  }
  std::_Exit(0);
}

// An executor left behind by Abandon (a dead peer) does not touch its Runtime after Shutdown().
TEST(ThreadRankReviewLifetimeDeathTest, AbandonedExecutorDoesNotTouchADestroyedRuntime) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(AbandonedExecutorScenario(), ::testing::ExitedWithCode(0), "");
}

// Regression: one rank shuts down while the others are idle; the heartbeat carries the shutdown to
// them, their pending callbacks fail exactly once, enqueue is refused, and their own shutdown()
// returns promptly.
TEST(ThreadRankReviewLifetime, ShutdownOfOneRankReachesIdleRanks) {
  Config c = SmallConfig();
  const int n = 3;
  ThreadWorld world(n, c);
  ASSERT_TRUE(world.init_status().ok());
  std::atomic<int> calls{0};
  auto buf = std::make_shared<std::vector<float>>(4, 1.f);
  // Rank 1 has a tensor nobody else submits.
  ASSERT_TRUE(world.rt(1)
                  .Enqueue(0, One(AllreduceItem("lonely", buf->data(), buf->data(), 4)),
                           [&calls](const Status& s) {
                             calls++;
                             EXPECT_EQ(s.code(), StatusCode::kUnknownError);
                           })
                  .ok());
  auto f = Detached<int>([&world] {
    world.rt(0).Shutdown();
    return 0;
  });
  ASSERT_EQ(f.wait_for(kWait), std::future_status::ready);
  for (int r = 1; r < n; ++r) {
    const auto deadline = Clock::now() + kWait;
    bool down = false;
    while (!down && Clock::now() < deadline) {
      down = world.rt(r).Enqueue(0, {}, [](const Status&) {}).code() == StatusCode::kUnknownError;
      if (!down) std::this_thread::sleep_for(10ms);
    }
    EXPECT_TRUE(down) << "rank " << r << " never learned of rank 0's shutdown";
  }
  const auto start = Clock::now();
  world.Shutdown();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace testing
}  // namespace hvdc

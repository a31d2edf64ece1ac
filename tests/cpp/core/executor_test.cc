// The executor with ranks as threads (thread_rank_harness.h): batches of overlapping process sets
// whose rounds complete in different orders on different ranks (gated control channels), with
// the executor on its own thread or inline on the control thread (MPI_THREAD_SERIALIZED); a local
// allocation failure inside a batch; an executor abandoned at shutdown. Every wait is bounded.
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

#include "tests/cpp/util/thread_rank_harness.h"

namespace hvdc {
namespace testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// With MPI_THREAD_SERIALIZED the executor runs batches inline on the control thread, blocking it in
// a data collective until the peers run the same batch. Three overlapping sets A={0,1}, B={1,2},
// C={0,2}, one cached allreduce on each: when the rounds of a rank's two sets complete in the order
// C,A on rank 0, A,B on rank 1 and B,C on rank 2 (round completion order differs between ranks with
// nonblocking collectives; here it is forced by holding back each rank's view of its sets' rounds
// and releasing one set per rank first), rank 0 blocks in C waiting for rank 2, rank 2 in B waiting
// for rank 1 and rank 1 in A waiting for rank 0: a cycle no rank can leave, since the rounds that
// would unblock them need the blocked control threads. The in-memory data plane's 5-s arrival
// timeout turns the cycle into errors here; with MPI it is a hang. (Running ready batches of
// different sets in ascending set id within a step does not keep overlapping sets from
// deadlocking when control and execution share one thread: docs/core.md, "Execution order".)
void OverlappingSetsWithSkewedRounds(bool threads) {
  Config c = SmallConfig();
  WorldOptions o;
  o.size = 3;
  o.config = c;
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
  ThreadWorld world(o);
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
TEST(Executor, SerializedExecutionWithOverlappingSetsDoesNotDeadlock) {
  OverlappingSetsWithSkewedRounds(false);
}

// Regression: the same skew with an executor thread per set (MPI_THREAD_MULTIPLE) completes.
TEST(Executor, ThreadedExecutionWithOverlappingSetsAndSkewedRoundsCompletes) {
  OverlappingSetsWithSkewedRounds(true);
}

// A local failure inside a batch (here: the framework's allocator returns null on one rank, as on
// an out-of-memory) makes HostBackend return before the collective on that rank only. The peers
// are inside the collective; the failing rank's *next* collective is matched with it. The data
// plane is desynchronized for good: in the in-memory world every later collective fails (kind
// mismatch, then missing ranks); with MPI an Allgatherv meets an Allreduce (undefined: hang or
// garbage).
TEST(Executor, LocalAllocationFailureDoesNotDesynchronizeTheDataPlane) {
  Config c = SmallConfig();
  WorldOptions o;
  o.size = 2;
  o.config = c;
  o.arrival_timeout = 5000ms;
  ThreadWorld world(o);
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
  c.peer_loss_exit_s = 0;  // the stall shutdown must not end this process
  WorldOptions o;
  o.size = 2;
  o.config = c;
  o.arrival_timeout = 5000ms;
  o.gates.resize(2);
  auto hold = std::make_shared<std::atomic<bool>>(false);
  o.gates[1][{0, 1}] = hold;
  auto* world = new ThreadWorld(o);  // leaked: the child exits with _Exit
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
  (void)world->rt(0).Shutdown();  // the peer is gone: an error here is expected
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
TEST(ExecutorDeathTest, AbandonedExecutorDoesNotTouchADestroyedRuntime) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(AbandonedExecutorScenario(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace testing
}  // namespace hvdc

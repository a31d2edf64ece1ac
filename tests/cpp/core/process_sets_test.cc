// Process sets added and removed at run time, with ranks as threads (thread_rank_harness.h): a
// collective in flight during add_process_set completes; removal fails a pending tensor once, is
// retried after a disagreement, and returns when the runtime shuts down meanwhile; errors in a set
// name world ranks. Tests whose scenario can leave a thread stuck leak their world instead of
// destroying it, so they fail rather than hang. Every wait is bounded.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/cpp/util/thread_rank_harness.h"

namespace hvdc {
namespace testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// add_process_set must not block the control thread in a world collective until every rank calls
// it: rank 1 enqueues an allreduce and then calls add_process_set; rank 0 runs the same allreduce
// synchronously and only then calls add_process_set -- the same order of collectives on both
// ranks. The change is agreed in the global set's rounds (applied by every rank at the end of the
// same round), so rank 1's control thread keeps negotiating the allreduce meanwhile. (It used to
// run CheckAgreement on the control thread: the allreduce never completed, and with MPI nothing
// ever released it.)
TEST(ProcessSets, CollectiveInFlightDuringAddProcessSetCompletes) {
  Config c = SmallConfig();
  c.dynamic_process_sets = true;
  ThreadWorld world(2, c);
  ASSERT_TRUE(world.init_status().ok());
  world.OnAllRanks([&](int r) {
    std::vector<float> buf(16, static_cast<float>(r + 1));
    Runtime& rt = world.rt(r);
    if (r == 1) {
      auto f = Submit(rt, 0, One(AllreduceItem("before_add", buf.data(), buf.data(), 16)));
      const int id = AddSet(rt, {0});
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
    const int id = AddSet(rt, {0});  // releases rank 1 in any case
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
TEST(ProcessSets, AddUseRemoveWithPendingTensor) {
  Config c = SmallConfig();
  c.dynamic_process_sets = true;
  const int n = 3;
  ThreadWorld world(n, c);
  ASSERT_TRUE(world.init_status().ok());
  std::atomic<int> calls{0};
  auto pending_buf = std::make_shared<std::vector<float>>(4, 1.f);
  world.OnAllRanks([&](int r) {
    Runtime& rt = world.rt(r);
    const int id = AddSet(rt, {0, 2});
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
    auto removed = Detached<int>([&rt, id] { return RemoveSet(rt, id); });
    ASSERT_EQ(removed.wait_for(kWait), std::future_status::ready);
    EXPECT_EQ(removed.get(), 0);
    EXPECT_EQ(SetSize(rt, id), Code(ProcessSetError::kUnknownSet));
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
TEST(ProcessSets, RemoveProcessSetReturnsWhenTheRuntimeShutsDownMeanwhile) {
  Config c;
  c.dynamic_process_sets = true;
  c.stall_check_time_s = 0.4;  // heartbeat 0.1 s: idle ranks join rounds quickly
  WorldOptions o;
  o.size = 3;
  o.config = c;
  o.extra_sets = {{0, 1}};
  o.gates.resize(3);
  auto hold = std::make_shared<std::atomic<bool>>(false);
  o.gates[0][{0, 1}] = hold;
  auto* world = new ThreadWorld(o);
  ASSERT_TRUE(world->init_status().ok()) << world->init_status().ToString();
  hold->store(true);
  std::vector<std::future<int>> removed;
  for (int r = 0; r < 3; ++r) {
    removed.push_back(Detached<int>([world, r] {
      const int rc = RemoveSet(world->rt(r), 1);
      if (r == 2) (void)world->rt(2).Shutdown();  // what it returns is not under test
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
      EXPECT_TRUE(rc == 0 || rc == Code(ProcessSetError::kShutDown)) << rc;
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
TEST(ProcessSets, RemoveProcessSetReturnsWhenThePeerShutdownLandsDuringExecutorStop) {
  Config c;
  c.dynamic_process_sets = true;
  c.stall_check_time_s = 0.4;  // heartbeat 0.1 s
  WorldOptions o;
  o.size = 3;
  o.config = c;
  o.extra_sets = {{0, 1}};
  auto* world = new ThreadWorld(o);
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
      const int rc = RemoveSet(world->rt(r), 1);
      if (r == 2) (void)world->rt(2).Shutdown();  // what it returns is not under test
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
      EXPECT_TRUE(rc == 0 || rc == Code(ProcessSetError::kShutDown)) << rc;
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
TEST(ProcessSets, RemoveProcessSetCanBeRetriedAfterADisagreement) {
  Config c = SmallConfig();
  c.dynamic_process_sets = true;
  ThreadWorld world(2, c, {{0}, {1}});  // ids 1 and 2
  ASSERT_TRUE(world.init_status().ok());
  world.OnAllRanks([&](int r) {
    Runtime& rt = world.rt(r);
    EXPECT_EQ(RemoveSet(rt, r == 0 ? 1 : 2), Code(ProcessSetError::kInit));
    bool threw = false;
    int rc = -100;
    try {
      rc = RemoveSet(rt, 1);
    } catch (const std::exception& e) {
      threw = true;
      ADD_FAILURE() << "rank " << r << ": retrying remove_process_set threw: " << e.what();
    }
    if (threw) {
      // Pair up with the other rank's pending world collective so that it returns.
      RemoveSet(rt, 2);
      return;
    }
    EXPECT_TRUE(rc == 0 || rc == Code(ProcessSetError::kInit)) << rc;
  });
}

// MergeRequests formats its mismatch message with indices into the process set (set ranks), but
// the message says "rank": in set {1, 2}, world rank 2's bad shape is reported as "rank 1".
TEST(ProcessSets, MismatchInAProcessSetNamesWorldRanks) {
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

}  // namespace
}  // namespace testing
}  // namespace hvdc

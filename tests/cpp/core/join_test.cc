// join() with ranks as threads (thread_rank_harness.h): tensors pending when a rank joins
// complete with its zeros (cached or not, fused, zero-copy, chunked, averaged, scaled); cached
// barriers and broadcasts are not left waiting while a rank has joined; the ranks still training
// are not throttled by the joined rank's heartbeat. Every wait is bounded.
#include <gtest/gtest.h>

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

TEST(Join, JoinWithUncachedAllreducePendingCompletesIt) { JoinWithPendingAllreduce(false); }

TEST(Join, JoinWithCachedAllreducePendingCompletesIt) { JoinWithPendingAllreduce(true); }

// A joined rank sets the ready bit of every cached *allreduce* only. A barrier (which MergeRequests
// allows while a rank has joined) that was negotiated before travels as a cache bit, so it is
// never ready while a rank has joined: it waits until the stall inspector renegotiates it in full
// (stall_check_time/2 = 30 s by default; forever with HOROVOD_STALL_CHECK_DISABLE).
TEST(Join, CachedBarrierCompletesWhileARankHasJoined) {
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
TEST(Join, CachedBroadcastFailsPromptlyWhileARankHasJoined) {
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
TEST(Join, RanksStillTrainingAfterAJoinAreNotThrottledByTheHeartbeat) {
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
TEST(Join, JoinedRankZerosMatchChunkingAndScaling) {
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

}  // namespace
}  // namespace testing
}  // namespace hvdc

// Runtime start-up and shutdown with ranks as threads (thread_rank_harness.h): ranks whose
// settings would plan different batches are refused at init; a failed init returns promptly; one
// rank's shutdown reaches idle ranks. Every wait is bounded.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "tests/cpp/util/thread_rank_harness.h"

namespace hvdc {
namespace testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The planner runs on every rank with that rank's own Config. Ranks whose HOROVOD_FUSION_THRESHOLD
// (or HVDC_CHUNK_BYTES / zero-copy size) differ plan different batches for the same responses:
// here rank 0 fuses two tensors into one allreduce while rank 1 runs two -- the in-memory world
// reports the count mismatch; MPI would reduce the wrong bytes or hang. (Horovod fuses on the
// coordinator, so a differing threshold is harmless there.)
TEST(Runtime, RanksWithDifferentFusionSettingsAreRefusedAtInit) {
  Config a = SmallConfig();
  Config b = SmallConfig();
  b.fusion_threshold_bytes = 0;  // no fusion on rank 1
  WorldOptions o;
  o.size = 2;
  o.configs = {a, b};
  o.arrival_timeout = 5000ms;
  ThreadWorld world(o);
  ASSERT_FALSE(world.init_status().ok());
  EXPECT_NE(world.init_status().message().find("HOROVOD_FUSION_THRESHOLD"), std::string::npos)
      << world.init_status().ToString();
}

// Runtime::Create failing after the control io_context exists (an invalid process set at init,
// a timeline that cannot be opened) destroys the Runtime, whose Shutdown() posts to an io_context
// that no thread runs and waits max(60 s, stall_shutdown + 10 s) for it.
TEST(Runtime, InitWithAnInvalidProcessSetFailsPromptly) {
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

// Regression: one rank shuts down while the others are idle; the heartbeat carries the shutdown to
// them, their pending callbacks fail exactly once, enqueue is refused, and their own shutdown()
// returns promptly.
TEST(Runtime, ShutdownOfOneRankReachesIdleRanks) {
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
  auto f = Detached<int>([&world] { return world.rt(0).Shutdown().ok() ? 0 : 1; });
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

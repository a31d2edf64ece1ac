// Stall handling and the timeline, with ranks as threads: a tensor that was negotiated before (so
// it travels as a cache bit) and then is not submitted by one rank is still reported with that
// rank's number, and the stall shutdown fails it; the coordinator's timeline records negotiation
// and execution.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/cpp/util/thread_rank_harness.h"

namespace hvdc {
namespace testing {
namespace {

TEST(ThreadRankStall, CachedTensorMissingOnOneRankIsReportedAndShutsDown) {
  Config config;
  config.stall_check_time_s = 0.4;
  config.stall_shutdown_time_s = 1.2;
  config.peer_loss_exit_s = 0;  // a stall shutdown must not end the test binary
  const int n = 3;
  ThreadWorld world(n, config);
  ASSERT_TRUE(world.init_status().ok());
  world.OnAllRanks([&](int r) {
    std::vector<float> buf(16, 1.f);
    std::vector<EnqueueItem> items;
    items.push_back(AllreduceItem("cached", buf.data(), buf.data(), 16));
    ASSERT_TRUE(Submit(world.rt(r), 0, std::move(items)).get().ok());  // now in the cache
    if (r == n - 1) return;  // the last rank never submits it again
    items.clear();
    items.push_back(AllreduceItem("cached", buf.data(), buf.data(), 16));
    const auto start = std::chrono::steady_clock::now();
    Status s = Submit(world.rt(r), 0, std::move(items)).get();
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(s.code(), StatusCode::kUnknownError) << s.ToString();
    EXPECT_NE(s.message().find("'cached'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("not by ranks [2]"), std::string::npos) << s.message();
    EXPECT_LT(waited, 30.0);
  });
  // Everything later is refused with the same reason.
  std::vector<float> x(1);
  std::vector<EnqueueItem> items;
  items.push_back(AllreduceItem("later", x.data(), x.data(), 1));
  Status s = world.rt(0).Enqueue(0, std::move(items), [](const Status&) {});
  EXPECT_EQ(s.code(), StatusCode::kUnknownError);
  EXPECT_NE(s.message().find("Stalled"), std::string::npos) << s.message();
}

// A rank that stops taking part in negotiation altogether (its control thread hangs: gated, it
// deposits its part of a round but never sees one complete, so it never starts the next). The
// other ranks' round waits on it alone: their stall warning and their stall shutdown name rank 2
// only -- not every rank of the set -- and the pending operation fails with that message.
TEST(ThreadRankStall, RoundStallNamesOnlyTheMissingRank) {
  Config config = SmallConfig();
  config.stall_check_time_s = 0.2;
  config.stall_shutdown_time_s = 0.4;
  config.peer_loss_exit_s = 0;  // a stall shutdown must not end the test binary
  const int n = 3;
  const int hung = 2;
  WorldOptions o;
  o.size = n;
  o.config = config;
  o.gates.resize(n);
  auto hold = std::make_shared<std::atomic<bool>>(false);
  o.gates[hung][{0, 1, 2}] = hold;
  ThreadWorld world(o);
  ASSERT_TRUE(world.init_status().ok()) << world.init_status().ToString();
  std::vector<std::vector<float>> bufs(n, std::vector<float>(8, 1.f));
  world.OnAllRanks([&](int r) {
    auto f = Submit(world.rt(r), 0, One(AllreduceItem("t", bufs[r].data(), bufs[r].data(), 8)));
    ASSERT_TRUE(ReadyWithin(f));
    ASSERT_TRUE(f.get().ok());
  });
  ::testing::internal::CaptureStderr();
  hold->store(true);
  std::vector<std::future<Status>> pending;
  for (int r = 0; r < n; ++r) {
    if (r == hung) continue;
    pending.push_back(
        Submit(world.rt(r), 0, One(AllreduceItem("t", bufs[r].data(), bufs[r].data(), 8))));
  }
  std::vector<Status> got;
  for (auto& f : pending)
    got.push_back(ReadyWithin(f, std::chrono::seconds(60)) ? f.get() : Status::OK());
  // The hung rank gives up too (it cannot tell who is missing: everything reached it).
  std::vector<float> x(1);
  bool hung_down = false;
  for (int i = 0; i < 6000 && !hung_down; ++i) {
    hung_down =
        world.rt(hung).Enqueue(0, {}, [](const Status&) {}).code() == StatusCode::kUnknownError;
    if (!hung_down) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  hold->store(false);
  for (const Status& s : got) {
    EXPECT_EQ(s.code(), StatusCode::kUnknownError) << s.ToString();
    EXPECT_NE(s.message().find("ranks [2] did not take part"), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find("[0, 1, 2]"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(hung_down);
  EXPECT_NE(log.find("waited"), std::string::npos) << log;
  EXPECT_NE(log.find("for ranks [2] to take part"), std::string::npos) << log;
  EXPECT_EQ(log.find("for ranks [0, 1, 2]"), std::string::npos) << log;
  // Later operations are refused with the same reason.
  Status later = world.rt(0).Enqueue(0, One(AllreduceItem("later", x.data(), x.data(), 1)),
                                     [](const Status&) {});
  EXPECT_NE(later.message().find("ranks [2]"), std::string::npos) << later.message();
}

TEST(ThreadRankTimeline, CoordinatorWritesNegotiationAndExecution) {
  const std::string path = ::testing::TempDir() + "hvdc_thread_rank_timeline.json";
  Config config;
  config.timeline_path = path;
  config.timeline_mark_cycles = true;
  {
    ThreadWorld world(2, config);
    ASSERT_TRUE(world.init_status().ok()) << world.init_status().ToString();
    world.OnAllRanks([&](int r) {
      for (int step = 0; step < 3; ++step) {
        std::vector<float> a(8, 1.f), b(300000, 2.f);
        std::vector<EnqueueItem> items;
        items.push_back(AllreduceItem("small", a.data(), a.data(), 8));
        auto f1 = Submit(world.rt(r), 0, std::move(items));
        items.clear();
        items.push_back(AllreduceItem("large", b.data(), b.data(), 300000));
        auto f2 = Submit(world.rt(r), 0, std::move(items));
        ASSERT_TRUE(f1.get().ok());
        ASSERT_TRUE(f2.get().ok());
      }
    });
  }
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.front(), '[');
  EXPECT_EQ(text[text.find_last_not_of(" \n\r\t")], ']');
  for (const char* needle :
       {"NEGOTIATE_ALLREDUCE", "\"ALLREDUCE\"", "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE",
        "MEMCPY_OUT_FUSION_BUFFER", "CYCLE_START", "small", "large"}) {
    EXPECT_NE(text.find(needle), std::string::npos) << needle;
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace testing
}  // namespace hvdc

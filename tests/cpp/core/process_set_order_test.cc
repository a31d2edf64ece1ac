// Process-set changes agreed in the global set's rounds, the one execution order all ranks share
// when control and execution run on one thread (MPI_THREAD_SERIALIZED), and the runtime's thread
// names. Ranks are threads over the in-memory world; every wait is bounded.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/cpp/util/thread_rank_harness.h"

namespace hvdc {
namespace testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A world over the harness's in-memory transport; `threads` false reports MPI_THREAD_SERIALIZED.
WorldOptions Options(int n, bool threads, std::vector<std::vector<int>> extra_sets = {}) {
  WorldOptions o;
  o.size = n;
  o.config = SmallConfig();
  o.config.dynamic_process_sets = true;
  o.threads = threads;
  o.arrival_timeout = 10000ms;
  o.extra_sets = std::move(extra_sets);
  return o;
}

bool Member(const std::vector<int>& ranks, int r) {
  return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
}

// Every rank issues allreduces on the global set and on each extra set it belongs to, all at once
// and in a rank-dependent order, several steps in a row; each result is the sum over the set.
void RunInterleaved(ThreadWorld& world, int n,
                    const std::vector<std::pair<int, std::vector<int>>>& sets, int steps) {
  world.OnAllRanks([&](int r) {
    for (int step = 0; step < steps; ++step) {
      std::vector<std::pair<int, std::vector<int>>> mine;
      for (auto& s : sets) {
        if (Member(s.second, r)) mine.push_back(s);
      }
      if ((r + step) % 2) std::reverse(mine.begin(), mine.end());
      std::vector<std::vector<float>> bufs(mine.size(), std::vector<float>(300));
      std::vector<std::future<Status>> done;
      for (size_t i = 0; i < mine.size(); ++i) {
        std::fill(bufs[i].begin(), bufs[i].end(), static_cast<float>(r + 1));
        done.push_back(Submit(world.rt(r), mine[i].first,
                              One(AllreduceItem("t" + std::to_string(step % 3), bufs[i].data(),
                                                bufs[i].data(), 300))));
      }
      for (size_t i = 0; i < mine.size(); ++i) {
        ASSERT_EQ(done[i].wait_for(kWait), std::future_status::ready)
            << "rank " << r << " step " << step << " set " << mine[i].first;
        Status s = done[i].get();
        ASSERT_TRUE(s.ok()) << s.ToString();
        float want = 0;
        for (int q : mine[i].second) want += static_cast<float>(q + 1);
        EXPECT_EQ(bufs[i][299], want) << "set " << mine[i].first;
      }
    }
  });
  (void)n;
}

// The global set and a set of two of its three ranks, used at once in opposite orders: with the
// executor inline on the control thread, rank 0 could run the global batch while rank 1 runs the
// set's (each waiting for the other) if each ran batches as its own rounds completed.
TEST(ProcessSetOrder, SerializedGlobalAndSubsetInterleave) {
  ThreadWorld world(Options(3, /*threads=*/false, {{0, 1}}));
  ASSERT_TRUE(world.init_status().ok()) << world.init_status().ToString();
  RunInterleaved(world, 3, {{0, {0, 1, 2}}, {1, {0, 1}}}, 20);
}

TEST(ProcessSetOrder, SerializedOverlappingSetsInterleave) {
  ThreadWorld world(Options(4, /*threads=*/false, {{0, 1}, {1, 2, 3}, {0, 3}}));
  ASSERT_TRUE(world.init_status().ok()) << world.init_status().ToString();
  RunInterleaved(world, 4, {{0, {0, 1, 2, 3}}, {1, {0, 1}}, {2, {1, 2, 3}}, {3, {0, 3}}}, 12);
}

// Sets added at run time (agreed in global rounds) join the same order; a set used only by some
// ranks does not wait for the idle rank's heartbeat; removal while a tensor is pending fails that
// tensor once; the freed id is handed out again.
void AddUseRemove(bool threads) {
  ThreadWorld world(Options(3, threads));
  ASSERT_TRUE(world.init_status().ok()) << world.init_status().ToString();
  std::atomic<int> orphan_calls{0};
  auto orphan_buf = std::make_shared<std::vector<float>>(4, 1.f);
  world.OnAllRanks([&](int r) {
    Runtime& rt = world.rt(r);
    const int a = AddSet(rt, {0, 2});
    const int b = AddSet(rt, {1, 2});
    ASSERT_EQ(a, 1);
    ASSERT_EQ(b, 2);
    EXPECT_EQ(AddSet(rt, {2, 0}), Code(ProcessSetError::kExistingSet));
    const auto start = Clock::now();
    for (int step = 0; step < 10; ++step) {
      if (r == 1) break;  // idle on set a
      std::vector<float> buf(8, static_cast<float>(r + 1));
      auto f = Submit(rt, a, One(AllreduceItem("a_t", buf.data(), buf.data(), 8)));
      ASSERT_EQ(f.wait_for(kWait), std::future_status::ready);
      ASSERT_TRUE(f.get().ok());
      EXPECT_EQ(buf[0], 4.f);
    }
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 3.0)
        << "collectives on a set waited for a non-member's heartbeat";
    if (r == 2) {
      ASSERT_TRUE(
          rt.Enqueue(b, One(AllreduceItem("orphan", orphan_buf->data(), orphan_buf->data(), 4)),
                     [&orphan_calls](const Status& s) {
                       orphan_calls++;
                       EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
                     })
              .ok());
    }
    EXPECT_EQ(RemoveSet(rt, b), 0);
    EXPECT_EQ(SetSize(rt, b), Code(ProcessSetError::kUnknownSet));
    EXPECT_EQ(RemoveSet(rt, b), Code(ProcessSetError::kUnknownSet));
    const int c = AddSet(rt, {0, 1});
    EXPECT_EQ(c, b) << "the freed id is handed out again";
    if (r != 2) {
      std::vector<float> buf(8, static_cast<float>(r + 1));
      auto f = Submit(rt, c, One(AllreduceItem("c_t", buf.data(), buf.data(), 8)));
      ASSERT_EQ(f.wait_for(kWait), std::future_status::ready);
      ASSERT_TRUE(f.get().ok());
      EXPECT_EQ(buf[0], 3.f);
    }
    EXPECT_EQ(RemoveSet(rt, a), 0);
    EXPECT_EQ(RemoveSet(rt, c), 0);
    EXPECT_EQ(rt.ProcessSetIds(), std::vector<int>{0});
  });
  EXPECT_EQ(orphan_calls.load(), 1);
}

TEST(ProcessSetOrder, AddUseRemoveThreaded) { AddUseRemove(true); }
TEST(ProcessSetOrder, AddUseRemoveSerialized) { AddUseRemove(false); }

// Changes are agreed in order: ranks calling add_process_set with the same lists in the same order
// get the same ids while other collectives run in between on some ranks only.
TEST(ProcessSetOrder, AddWhileOtherRanksRunCollectives) {
  ThreadWorld world(Options(3, /*threads=*/true));
  ASSERT_TRUE(world.init_status().ok());
  world.OnAllRanks([&](int r) {
    Runtime& rt = world.rt(r);
    std::vector<float> buf(16, 1.f);
    std::future<Status> f;
    if (r != 0) f = Submit(rt, 0, One(AllreduceItem("mid", buf.data(), buf.data(), 16)));
    const int a = AddSet(rt, {0, 1});
    if (r == 0) {
      f = Submit(rt, 0, One(AllreduceItem("mid", buf.data(), buf.data(), 16)));
    }
    const int b = AddSet(rt, {1, 2});
    EXPECT_EQ(a, 1);
    EXPECT_EQ(b, 2);
    ASSERT_EQ(f.wait_for(kWait), std::future_status::ready);
    EXPECT_TRUE(f.get().ok());
    EXPECT_EQ(buf[0], 3.f);
  });
}

// Disagreeing changes fail on every rank and leave the queue of changes in step.
TEST(ProcessSetOrder, DisagreeingAddFailsEverywhere) {
  ThreadWorld world(Options(2, /*threads=*/true));
  ASSERT_TRUE(world.init_status().ok());
  world.OnAllRanks([&](int r) {
    Runtime& rt = world.rt(r);
    EXPECT_EQ(AddSet(rt, {r}), Code(ProcessSetError::kInit));
    EXPECT_EQ(AddSet(rt, {0}), 1);
    EXPECT_EQ(SetIncluded(rt, 1), r == 0 ? 1 : 0);
  });
}

// The control thread and each executor thread carry a name (shown by top -H, gdb, perf).
TEST(ProcessSetOrder, ThreadsAreNamed) {
  ThreadWorld world(Options(2, /*threads=*/true, {{0}}));
  ASSERT_TRUE(world.init_status().ok());
  std::multiset<std::string> names;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      std::getline(comm, name);
      names.insert(name);
    }
    closedir(dir);
  }
  EXPECT_EQ(names.count("hvdc-control"), 2u);
  EXPECT_EQ(names.count("hvdc-exec-0"), 2u);
  EXPECT_EQ(names.count("hvdc-exec-1"), 1u);
}

}  // namespace
}  // namespace testing
}  // namespace hvdc

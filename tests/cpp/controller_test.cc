// The controller's negotiation of grouped collectives through the response cache, with ranks as
// threads (thread_rank_harness.h): groups whose members are partly cached, evicted or renegotiated
// complete, with the sum over ranks. Every wait is bounded.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/cpp/thread_rank_harness.h"

namespace hvdc {
namespace testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

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
TEST(ControllerGroups, GroupWithSomeMembersEvictedFromTheCacheCompletes) {
  Config c = SmallConfig();
  c.cache_capacity = 3;
  RunGroupTwice(2, c, {4, 4, 4, 4, 4}, {4, 4, 4, 4, 4});
}

// The same with the default cache: one member changes shape between steps (dynamic shapes), so
// its cache entry is invalidated and it is renegotiated in full while the other member completes
// from the cache.
TEST(ControllerGroups, GroupWhoseMemberChangesShapeCompletes) {
  RunGroupTwice(2, SmallConfig(), {4, 4}, {4, 6});
}

// Regression/contrast: with the response cache disabled the same shape change completes (every
// member is negotiated in full, so the coordinator sees the whole group).
TEST(ControllerGroups, GroupWhoseMemberChangesShapeWithoutCacheCompletes) {
  Config c = SmallConfig();
  c.cache_capacity = 0;
  RunGroupTwice(2, c, {4, 4}, {4, 6});
}

// Regression: a group repeated with an unchanged cache completes every time.
TEST(ControllerGroups, RepeatedGroupFullyCachedCompletes) {
  RunGroupTwice(3, SmallConfig(), {4, 700, 4}, {4, 700, 4});
}

}  // namespace
}  // namespace testing
}  // namespace hvdc

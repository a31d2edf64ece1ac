// The Negotiator, with ranks as threads. First driven directly, one Negotiator per rank over the
// in-memory world's control channels: every rank gets the same responses in the same order, a
// repeated round travels as cache bits only, the caller's extra words come back ANDed, a tensor
// waits for every rank, mismatches and shutdown reach every rank. Then through whole runtimes
// (thread_rank_harness.h): groups whose members are partly cached, evicted or renegotiated
// complete with the sum over ranks. Every wait is bounded.
#include "core/negotiator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
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

// ---- Negotiators driven directly ----

// One rank's negotiator of the global set of an n-rank in-memory world.
class RankNegotiator {
 public:
  RankNegotiator(const std::shared_ptr<LocalWorld>& world, int rank, const Config& config)
      : config_(config), transport_(MakeLocalTransport(world, rank)) {
    std::vector<int> ranks(world->size());
    for (int r = 0; r < world->size(); ++r) ranks[r] = r;
    status_ = transport_->CreateProcessSet(ranks, &channels_);
    if (status_.ok()) {
      negotiator_ =
          std::make_unique<Negotiator>(0, config_, channels_.control.get(), nullptr, ranks);
    }
  }
  const Status& status() const { return status_; }
  Negotiator& c() { return *negotiator_; }

  std::shared_ptr<TensorEntry> Submit(Request q) {
    auto e = std::make_shared<TensorEntry>();
    e->request = std::move(q);
    e->enqueued_at = Clock::now();
    negotiator_->Submit(e);
    return e;
  }

  // One round (collective: every rank runs it); false if it did not finish within kWait.
  bool Round(RoundResult* out, const std::vector<uint64_t>& extra = {}) {
    negotiator_->StartRound(Clock::now(), extra);
    const auto deadline = Clock::now() + kWait;
    while (!negotiator_->Poll(Clock::now(), out)) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(50us);
    }
    return true;
  }

 private:
  Config config_;
  std::unique_ptr<Transport> transport_;
  ProcessSetChannels channels_;
  std::unique_ptr<Negotiator> negotiator_;
  Status status_;
};

// Runs fn(rank, negotiator) on n threads, each with its own negotiator.
void WithNegotiators(int n, const Config& config,
                     const std::function<void(int, RankNegotiator&)>& fn) {
  auto world = LocalWorld::Create(n, 30000ms);
  ASSERT_NE(world, nullptr);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      RankNegotiator rc(world, r, config);
      ASSERT_TRUE(rc.status().ok()) << rc.status().ToString();
      fn(r, rc);
    });
  }
  for (auto& t : threads) t.join();
}

Request Allreduce(const std::string& name, int64_t count) {
  Request q;
  q.name = name;
  q.shape = {count};
  return q;
}

std::vector<std::string> ReadyNames(const RoundResult& res) {
  std::vector<std::string> names;
  for (const BatchItem& item : res.ready) names.push_back(item.response->name);
  return names;
}

class NegotiatorRounds : public ::testing::TestWithParam<int> {};

// Every rank submits the same tensors in its own order: one round makes all of them ready, in one
// order shared by every rank, each with this rank's own entry; the same tensors again travel as
// cache bits only (no exchange of requests), unless the cache is off.
TEST_P(NegotiatorRounds, EveryRankGetsTheSameResponsesInTheSameOrder) {
  const int n = GetParam();
  const int kTensors = 7;
  for (int64_t capacity : {0, 16}) {
    Config config = SmallConfig();
    config.cache_capacity = capacity;
    std::vector<std::vector<std::vector<std::string>>> names(n);  // [rank][round]
    WithNegotiators(n, config, [&](int r, RankNegotiator& rc) {
      for (int round = 0; round < 3; ++round) {
        std::map<std::string, std::shared_ptr<TensorEntry>> mine;
        for (int i = 0; i < kTensors; ++i) {
          const int t = (i * (r + 1) + round) % kTensors;  // a rank-dependent permutation
          const std::string name = "t" + std::to_string(t);
          mine[name] = rc.Submit(Allreduce(name, 4 + t));
        }
        RoundResult res;
        ASSERT_TRUE(rc.Round(&res)) << "rank " << r << " round " << round;
        EXPECT_FALSE(res.shutdown) << res.shutdown_reason;
        ASSERT_EQ(res.ready.size(), static_cast<size_t>(kTensors)) << "rank " << r;
        for (const auto& [shared, entry] : res.ready) {
          const Response& resp = *shared;
          EXPECT_EQ(resp.error_code, StatusCode::kOk) << resp.error_message;
          EXPECT_EQ(entry, mine.at(resp.name)) << "this rank's own entry";
          EXPECT_EQ(resp.shape, mine.at(resp.name)->request.shape);
        }
        const bool cached_round = round > 0 && capacity >= kTensors;
        EXPECT_EQ(res.exchanged_requests, !cached_round) << "round " << round;
        names[r].push_back(ReadyNames(res));
        EXPECT_FALSE(rc.c().has_pending());
      }
    });
    for (int r = 1; r < n; ++r) EXPECT_EQ(names[r], names[0]) << "rank " << r;
  }
}

// The caller's extra words come back ANDed over the ranks.
TEST_P(NegotiatorRounds, ExtraWordsComeBackAnded) {
  const int n = GetParam();
  auto word = [](int r, int i) { return ~(uint64_t{1} << ((r * 5 + i * 11) % 64)) ^ (r * 3); };
  std::vector<uint64_t> want(4, ~uint64_t{0});
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 4; ++i) want[i] &= word(r, i);
  }
  WithNegotiators(n, SmallConfig(), [&](int r, RankNegotiator& rc) {
    for (int round = 0; round < 2; ++round) {  // an idle round and one with a request
      if (round == 1) rc.Submit(Allreduce("x", 1));
      std::vector<uint64_t> extra;
      for (int i = 0; i < 4; ++i) extra.push_back(word(r, i));
      RoundResult res;
      ASSERT_TRUE(rc.Round(&res, extra));
      EXPECT_EQ(res.extra, want) << "rank " << r << " round " << round;
    }
  });
}

// A tensor is ready only in the round after the last rank submitted it; until then it is
// pending on the ranks that did.
TEST_P(NegotiatorRounds, ATensorWaitsForEveryRank) {
  const int n = GetParam();
  WithNegotiators(n, SmallConfig(), [&](int r, RankNegotiator& rc) {
    for (int round = 0; round < n; ++round) {
      if (round == r) rc.Submit(Allreduce("late", 8));  // rank r submits in round r
      RoundResult res;
      ASSERT_TRUE(rc.Round(&res));
      const bool last = round == n - 1;
      EXPECT_EQ(ReadyNames(res),
                last ? std::vector<std::string>{"late"} : std::vector<std::string>{})
          << "rank " << r << " round " << round;
      EXPECT_EQ(rc.c().has_pending(), !last && round >= r) << "rank " << r << " round " << round;
    }
  });
}

// Ranks that disagree on a tensor's shape all get the same error response for it.
TEST_P(NegotiatorRounds, MismatchedShapesFailTheTensorOnEveryRank) {
  const int n = GetParam();
  if (n < 2) GTEST_SKIP() << "needs two ranks to disagree";
  WithNegotiators(n, SmallConfig(), [&](int r, RankNegotiator& rc) {
    auto entry = rc.Submit(Allreduce("bad", r == n - 1 ? 5 : 4));
    RoundResult res;
    ASSERT_TRUE(rc.Round(&res));
    ASSERT_EQ(res.ready.size(), 1u);
    const Response& resp = *res.ready[0].response;
    EXPECT_EQ(res.ready[0].entry, entry);
    EXPECT_EQ(resp.error_code, StatusCode::kPreconditionError);
    EXPECT_NE(resp.error_message.find("rank " + std::to_string(n - 1) + " has [5]"),
              std::string::npos)
        << resp.error_message;
  });
}

// A shutdown requested on any one rank ends the round with shutdown on every rank; the
// coordinator's reason travels with it.
TEST_P(NegotiatorRounds, ShutdownOfOneRankReachesEveryRank) {
  const int n = GetParam();
  for (int requester = 0; requester < n; ++requester) {
    WithNegotiators(n, SmallConfig(), [&](int r, RankNegotiator& rc) {
      if (r == requester) rc.c().RequestShutdown("stop from " + std::to_string(r));
      RoundResult res;
      ASSERT_TRUE(rc.Round(&res));
      EXPECT_TRUE(res.shutdown) << "rank " << r << ", requested by " << requester;
      if (requester == 0) {
        EXPECT_EQ(res.shutdown_reason, "stop from 0");
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, NegotiatorRounds, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "np" + std::to_string(info.param);
                         });

// ---- Through whole runtimes ----

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
TEST(NegotiatorGroups, GroupWithSomeMembersEvictedFromTheCacheCompletes) {
  Config c = SmallConfig();
  c.cache_capacity = 3;
  RunGroupTwice(2, c, {4, 4, 4, 4, 4}, {4, 4, 4, 4, 4});
}

// The same with the default cache: one member changes shape between steps (dynamic shapes), so
// its cache entry is invalidated and it is renegotiated in full while the other member completes
// from the cache.
TEST(NegotiatorGroups, GroupWhoseMemberChangesShapeCompletes) {
  RunGroupTwice(2, SmallConfig(), {4, 4}, {4, 6});
}

// Regression/contrast: with the response cache disabled the same shape change completes (every
// member is negotiated in full, so the coordinator sees the whole group).
TEST(NegotiatorGroups, GroupWhoseMemberChangesShapeWithoutCacheCompletes) {
  Config c = SmallConfig();
  c.cache_capacity = 0;
  RunGroupTwice(2, c, {4, 4}, {4, 6});
}

// Regression: a group repeated with an unchanged cache completes every time.
TEST(NegotiatorGroups, RepeatedGroupFullyCachedCompletes) {
  RunGroupTwice(3, SmallConfig(), {4, 700, 4}, {4, 700, 4});
}

}  // namespace
}  // namespace testing
}  // namespace hvdc

// ProcessSetTable: lookups by id and by ranks, the free id, removal into the closing list (members
// only) and TakeFinished, over real ProcessSets created collectively on the in-memory world (every
// rank a thread). One test looks sets up from another thread while the table changes (TSan).
#include "core/process_set_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/timeline.h"
#include "local_controller/local_world.h"

namespace hvdc {
namespace {

constexpr int kWorld = 3;

// The sets every test creates, in this order (the id and creation number are the index).
const std::vector<std::vector<int>> kSets = {{0, 1, 2}, {0, 1}, {1, 2}, {2}};

void OnAllRanks(const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// One rank's sets, created collectively with the other ranks.
struct RankSets {
  Config config;
  std::unique_ptr<Transport> transport;
  std::vector<ProcessSetTable::SetPtr> sets;  // by id

  bool Create(const std::shared_ptr<LocalWorld>& world, int rank) {
    transport = MakeLocalTransport(world, rank);
    ProcessSet::Parts parts;
    parts.config = &config;
    parts.transport = transport.get();
    parts.timeline = std::make_shared<Timeline>();
    parts.wake = [] {};
    for (size_t id = 0; id < kSets.size(); ++id) {
      ProcessSetTable::SetPtr set;
      const Status s =
          ProcessSet::Create(static_cast<int>(id), static_cast<int>(id), kSets[id], parts, &set);
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (!s.ok()) return false;
      sets.push_back(std::move(set));
    }
    return true;
  }
  ~RankSets() { sets.clear(); }  // before the transport
};

bool Member(int rank, int id) {
  return std::find(kSets[id].begin(), kSets[id].end(), rank) != kSets[id].end();
}

bool Holds(const std::vector<ProcessSetTable::SetPtr>& all, int id) {
  return std::any_of(all.begin(), all.end(), [id](const auto& s) { return s->id == id; });
}

// Runs fn(rank, sets) on every rank after creating the sets there.
void WithSets(const std::function<void(int, RankSets&)>& fn) {
  auto world = LocalWorld::Create(kWorld, std::chrono::milliseconds(30000));
  ASSERT_NE(world, nullptr);
  OnAllRanks([&](int r) {
    RankSets rs;
    if (rs.Create(world, r)) fn(r, rs);
  });
}

TEST(ProcessSetTable, CreatedSetsKnowTheirRanksAndMembership) {
  WithSets([](int r, RankSets& rs) {
    for (size_t id = 0; id < kSets.size(); ++id) {
      const auto& set = rs.sets[id];
      EXPECT_EQ(set->id, static_cast<int>(id));
      EXPECT_EQ(set->seq, static_cast<int>(id));
      EXPECT_EQ(set->ranks, kSets[id]);
      EXPECT_EQ(set->member(), Member(r, static_cast<int>(id))) << "rank " << r << " set " << id;
      if (set->member()) {
        const auto it = std::find(kSets[id].begin(), kSets[id].end(), r);
        EXPECT_EQ(set->set_rank, static_cast<int>(it - kSets[id].begin()));
        EXPECT_NE(set->negotiator, nullptr);
        EXPECT_NE(set->executor, nullptr);
      } else {
        EXPECT_EQ(set->negotiator, nullptr);
      }
    }
  });
}

TEST(ProcessSetTable, LookupsByIdAndRanks) {
  WithSets([](int, RankSets& rs) {
    ProcessSetTable t;
    EXPECT_EQ(t.Find(0), nullptr);
    EXPECT_TRUE(t.Ids().empty());
    EXPECT_EQ(t.FreeId(), 1) << "ids handed out start at 1 (0 is the global set)";
    for (const auto& set : rs.sets) t.Insert(set);
    std::vector<int> want_ids;
    for (size_t id = 0; id < kSets.size(); ++id) {
      EXPECT_EQ(t.Find(static_cast<int>(id)), rs.sets[id]);
      EXPECT_EQ(t.IdOf(kSets[id]), static_cast<int>(id));
      want_ids.push_back(static_cast<int>(id));
    }
    EXPECT_EQ(t.Ids(), want_ids);
    EXPECT_EQ(t.Find(static_cast<int>(kSets.size())), nullptr);
    EXPECT_EQ(t.IdOf({0, 2}), -1);
    EXPECT_EQ(t.IdOf({}), -1);
    EXPECT_EQ(t.FreeId(), static_cast<int>(kSets.size()));
    EXPECT_EQ(t.All().size(), kSets.size());
  });
}

TEST(ProcessSetTable, AnySubsetOfSeveralIgnoresTheGlobalSetAndSingletons) {
  WithSets([](int, RankSets& rs) {
    ProcessSetTable t;
    EXPECT_FALSE(t.AnySubsetOfSeveral());
    t.Insert(rs.sets[0]);  // the global set, 3 ranks
    EXPECT_FALSE(t.AnySubsetOfSeveral());
    t.Insert(rs.sets[3]);  // {2}
    EXPECT_FALSE(t.AnySubsetOfSeveral());
    t.Insert(rs.sets[1]);  // {0, 1}
    EXPECT_TRUE(t.AnySubsetOfSeveral());
    (void)t.Remove(1);
    EXPECT_FALSE(t.AnySubsetOfSeveral());
  });
}

// Removing a set unregisters it; a member keeps it among All() until TakeFinished says it is
// done; a non-member forgets it at once. The global set is never removed; the freed id is reused.
TEST(ProcessSetTable, RemoveKeepsAMembersSetUntilFinished) {
  WithSets([](int r, RankSets& rs) {
    ProcessSetTable t;
    for (const auto& set : rs.sets) t.Insert(set);
    EXPECT_EQ(t.Remove(0), nullptr);
    EXPECT_EQ(t.Find(0), rs.sets[0]);
    EXPECT_EQ(t.Remove(42), nullptr);

    EXPECT_EQ(t.Remove(1), rs.sets[1]);
    EXPECT_EQ(t.Remove(1), nullptr) << "already removed";
    EXPECT_EQ(t.Find(1), nullptr);
    EXPECT_EQ(t.IdOf(kSets[1]), -1);
    EXPECT_EQ(t.Ids(), (std::vector<int>{0, 2, 3}));
    EXPECT_EQ(t.FreeId(), 1);
    EXPECT_EQ(Holds(t.All(), 1), Member(r, 1)) << "rank " << r;

    EXPECT_EQ(t.Remove(2), rs.sets[2]);
    EXPECT_TRUE(t.TakeFinished([](const ProcessSet&) { return false; }).empty());
    const auto done = t.TakeFinished([](const ProcessSet& s) { return s.id == 1; });
    EXPECT_EQ(done.size(), Member(r, 1) ? 1u : 0u);
    EXPECT_FALSE(Holds(t.All(), 1));
    EXPECT_EQ(Holds(t.All(), 2), Member(r, 2)) << "rank " << r;
    const auto rest = t.TakeFinished([](const ProcessSet&) { return true; });
    EXPECT_EQ(rest.size(), Member(r, 2) ? 1u : 0u);

    t.Clear();
    EXPECT_TRUE(t.All().empty());
    EXPECT_TRUE(t.Ids().empty());
    EXPECT_EQ(t.FreeId(), 1);
  });
}

// Enqueuing threads look sets up while the control thread inserts and removes them.
TEST(ProcessSetTable, LookupsFromOtherThreadsWhileTheTableChanges) {
  WithSets([](int, RankSets& rs) {
    ProcessSetTable t;
    t.Insert(rs.sets[0]);
    std::atomic<bool> stop{false};
    std::atomic<long> found{0};
    std::atomic<bool> started{false};
    std::thread reader([&] {
      started = true;
      do {
        for (int id = 0; id < static_cast<int>(kSets.size()); ++id) {
          if (auto s = t.Find(id)) found += s->id == id;
        }
        found += static_cast<long>(t.All().size() + t.Ids().size());
        (void)t.IdOf(kSets[2]);
        (void)t.FreeId();
      } while (!stop.load());
    });
    while (!started.load()) std::this_thread::yield();
    for (int round = 0; round < 200; ++round) {
      for (int id = 1; id < static_cast<int>(kSets.size()); ++id) t.Insert(rs.sets[id]);
      for (int id = 1; id < static_cast<int>(kSets.size()); ++id) (void)t.Remove(id);
      (void)t.TakeFinished([](const ProcessSet&) { return true; });
    }
    stop = true;
    reader.join();
    EXPECT_GT(found.load(), 0);
    EXPECT_EQ(t.Ids(), std::vector<int>{0});
  });
}

}  // namespace
}  // namespace hvdc

// EntrySet (core/entry_set.h): inserts, replacements, lookups and removals against a std::map
// model (the array stays dense: every walk sees exactly the entries in the set), and the entries
// kept alive while they are in the set.
#include "core/entry_set.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>

#include "tests/cpp/util/test_entries.h"

namespace hvdc {
namespace {

TEST(EntrySet, InsertFindErase) {
  EntrySet set;
  EXPECT_FALSE(set.Contains(Hashed("a")));
  EXPECT_FALSE(set.Erase(Hashed("a")));
  EXPECT_TRUE(set.Insert(Entry("a")));
  EXPECT_TRUE(set.Insert(Entry("b")));
  EXPECT_FALSE(set.Insert(Entry("a"))) << "a second entry of the same name";
  EXPECT_EQ(set.size(), 2u);
  EXPECT_TRUE(set.Contains(Hashed("a")));
  EXPECT_TRUE(set.Erase(Hashed("a")));
  EXPECT_FALSE(set.Contains(Hashed("a")));
  EXPECT_FALSE(set.Erase(Hashed("a"))) << "erased twice";
  EXPECT_TRUE(set.Contains(Hashed("b")));
  EXPECT_TRUE(set.Insert(Entry("a"))) << "the name may come back";
  EXPECT_EQ(set.size(), 2u);
}

TEST(EntrySet, PutReplacesAndTakeHandsOver) {
  EntrySet set;
  auto first = Entry("a");
  auto second = Entry("a");
  set.Put(first);
  set.Put(Entry("b"));
  set.Put(second);
  EXPECT_EQ(set.size(), 2u);
  EXPECT_EQ(set.Find(Hashed("a")), second.get()) << "the later entry of a name replaces the first";
  EXPECT_EQ(set.Take(Hashed("a")), second);
  EXPECT_EQ(set.Take(Hashed("a")), nullptr);
  EXPECT_EQ(set.Find(Hashed("b"))->request.name, "b") << "moved into the gap, still found";
  auto all = set.TakeAll();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0]->request.name, "b");
  EXPECT_TRUE(set.empty());
  EXPECT_FALSE(set.Contains(Hashed("b")));
  EXPECT_TRUE(set.Insert(Entry("b"))) << "usable again after TakeAll";
}

TEST(EntrySet, KeepsItsEntriesAlive) {
  EntrySet set;
  std::weak_ptr<TensorEntry> watch;
  {
    auto e = Entry(std::string(100, 'x'));  // a name on the heap
    watch = e;
    ASSERT_TRUE(set.Insert(std::move(e)));
  }
  EXPECT_FALSE(watch.expired());
  EXPECT_TRUE(set.Contains(Hashed(std::string(100, 'x'))));
  EXPECT_TRUE(set.Erase(Hashed(std::string(100, 'x'))));
  EXPECT_TRUE(watch.expired()) << "an erased entry is let go";
}

TEST(EntrySet, MatchesAMapModel) {
  EntrySet set;
  std::map<std::string, bool> model;  // name -> in the set
  std::mt19937 rng(7);
  for (int step = 0; step < 20000; ++step) {
    const std::string name = "t" + std::to_string(rng() % 300);
    switch (rng() % 4) {
      case 0:
        EXPECT_EQ(set.Insert(Entry(name)), !model[name]) << name;
        model[name] = true;
        break;
      case 1:
        EXPECT_EQ(set.Erase(Hashed(name)), model[name]) << name;
        model[name] = false;
        break;
      case 2: {
        auto taken = set.Take(Hashed(name));
        EXPECT_EQ(taken != nullptr, model[name]) << name;
        if (taken) {
          EXPECT_EQ(taken->request.name, name);
        }
        model[name] = false;
        break;
      }
      default: {
        TensorEntry* found = set.Find(Hashed(name));
        EXPECT_EQ(found != nullptr, model[name]) << name;
        if (found) {
          EXPECT_EQ(found->request.name, name);
        }
      }
    }
    if (step % 1000 == 0) {
      std::set<std::string> walked, want;
      for (auto& e : set.entries()) EXPECT_TRUE(walked.insert(e->request.name).second);
      for (auto& [n, present] : model) {
        if (present) want.insert(n);
      }
      EXPECT_EQ(walked, want) << "step " << step;
    }
  }
  size_t in = 0;
  for (auto& [name, present] : model) in += present;
  EXPECT_EQ(set.size(), in);
}

}  // namespace
}  // namespace hvdc

// NameIndex (core/name_index.h): lookups, inserts and erases against a std::map model, with
// hashes chosen to collide, to wrap around the table's end and to force growth.
#include "core/name_index.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

namespace hvdc {
namespace {

// Names live outside the index, as in the response cache: bit -> name.
struct Names {
  std::vector<std::string> of_bit;
  const std::string& operator()(uint32_t bit) const { return of_bit.at(bit); }
};

TEST(NameIndex, EmptyFindsNothing) {
  NameIndex index;
  Names names;
  EXPECT_EQ(index.Find("a", NameIndex::Hash("a"), names), NameIndex::kNone);
  EXPECT_FALSE(index.Erase(NameIndex::Hash("a"), 0));
  EXPECT_EQ(index.size(), 0u);
}

TEST(NameIndex, EqualHashesAreToldApartByName) {
  NameIndex index;
  Names names{{"a", "b", "c"}};
  for (uint32_t bit = 0; bit < 3; ++bit) index.Insert(7, bit);  // one hash for all three
  for (uint32_t bit = 0; bit < 3; ++bit) EXPECT_EQ(index.Find(names(bit), 7, names), bit);
  EXPECT_EQ(index.Find("d", 7, names), NameIndex::kNone);
  EXPECT_TRUE(index.Erase(7, 1));
  EXPECT_EQ(index.Find("a", 7, names), 0u);
  EXPECT_EQ(index.Find("b", 7, names), NameIndex::kNone);
  EXPECT_EQ(index.Find("c", 7, names), 2u) << "the run must stay reachable past the erased pair";
  EXPECT_FALSE(index.Erase(7, 1)) << "erased twice";
}

// Runs that wrap past the table's last slot, and erases inside them, in a table of 16 slots.
TEST(NameIndex, ErasingInsideAWrappedRunKeepsEveryOtherPairReachable) {
  Names names;
  const std::vector<uint64_t> hashes = {14, 15, 14, 15, 0, 1, 15};  // homes near the end
  for (size_t victim = 0; victim < hashes.size(); ++victim) {
    NameIndex index;
    names.of_bit.clear();
    for (uint32_t bit = 0; bit < hashes.size(); ++bit) {
      names.of_bit.push_back("n" + std::to_string(bit));
      index.Insert(hashes[bit], bit);
    }
    ASSERT_TRUE(index.Erase(hashes[victim], static_cast<uint32_t>(victim)));
    for (uint32_t bit = 0; bit < hashes.size(); ++bit) {
      const uint32_t want = bit == victim ? NameIndex::kNone : bit;
      EXPECT_EQ(index.Find(names(bit), hashes[bit], names), want)
          << "erased bit " << victim << ", looked up bit " << bit;
    }
  }
}

// Random inserts and erases (with few distinct hashes, so runs are long) against a model.
TEST(NameIndex, MatchesAMapUnderRandomInsertsAndErases) {
  std::mt19937 rng(11);
  Names names;
  for (uint32_t bit = 0; bit < 3000; ++bit) names.of_bit.push_back("tensor_" + std::to_string(bit));
  auto hash_of = [](uint32_t bit) { return NameIndex::Hash("h" + std::to_string(bit % 97)); };
  NameIndex index;
  std::map<uint32_t, bool> model;  // bit -> indexed
  for (int step = 0; step < 20000; ++step) {
    const uint32_t bit = rng() % 3000;
    if (model[bit]) {
      ASSERT_TRUE(index.Erase(hash_of(bit), bit));
      model[bit] = false;
    } else {
      index.Insert(hash_of(bit), bit);
      model[bit] = true;
    }
    if (step % 1000 == 999) {
      size_t indexed = 0;
      for (const auto& [b, in] : model) {
        indexed += in;
        ASSERT_EQ(index.Find(names(b), hash_of(b), names), in ? b : NameIndex::kNone) << b;
      }
      ASSERT_EQ(index.size(), indexed);
    }
  }
}

}  // namespace
}  // namespace hvdc

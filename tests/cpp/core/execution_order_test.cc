// The global round's extra words (execution_order.h): what one rank encodes, and what the AND over
// several ranks' words tells every rank -- whether all proposed the same set change, and how many
// held rounds of each set every member holds. Expectations are computed from the ranks' inputs
// (minimums, equality of hashes), never recorded.
#include "core/execution_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace hvdc {
namespace {

// What the control channel's bitwise AND over the ranks produces.
std::vector<uint64_t> AndAll(const std::vector<std::vector<uint64_t>>& per_rank) {
  std::vector<uint64_t> out = per_rank.at(0);
  for (const auto& words : per_rank) {
    EXPECT_EQ(words.size(), out.size()) << "every rank encodes the same number of words";
    for (size_t i = 0; i < out.size() && i < words.size(); ++i) out[i] &= words[i];
  }
  return out;
}

TEST(ExecutionOrder, WordCountFollowsTheSetsCreated) {
  for (int created : {0, 1, 2, 3, 10}) {
    const auto w = EncodeOrderWords(false, 0, created, {});
    EXPECT_EQ(w.size(), 3u + static_cast<size_t>(std::max(created - 1, 0))) << created;
  }
}

TEST(ExecutionOrder, OneRankRoundTrips) {
  const int created = 5;  // the global set and sets with seq 1..4
  const std::vector<HeldRounds> held = {{1, 0}, {2, 1}, {3, 7}, {4, 63}};
  for (uint64_t hash : {uint64_t{0}, uint64_t{1}, uint64_t{0x0123456789abcdefULL},
                        std::numeric_limits<uint64_t>::max()}) {
    const auto w = EncodeOrderWords(true, hash, created, held);
    EXPECT_TRUE(ChangeProposedByAll(w));
    EXPECT_TRUE(ChangeAgreed(w, hash)) << std::hex << hash;
    EXPECT_FALSE(ChangeAgreed(w, hash ^ 1)) << std::hex << hash;
    for (const HeldRounds& h : held) {
      EXPECT_EQ(ReleasableRounds(w, h.seq), static_cast<int>(h.rounds)) << "seq " << h.seq;
    }
  }
}

TEST(ExecutionOrder, NoChangePendingIsNeitherProposedNorAgreed) {
  const auto w = EncodeOrderWords(false, 42, 2, {});
  EXPECT_FALSE(ChangeProposedByAll(w));
  EXPECT_FALSE(ChangeAgreed(w, 42));
  EXPECT_FALSE(ChangeAgreed(w, 0)) << "no change is not the change that hashes to 0";
}

TEST(ExecutionOrder, TooFewWordsCarryNoChange) {
  EXPECT_FALSE(ChangeProposedByAll({}));
  EXPECT_FALSE(ChangeProposedByAll({1, 5}));
  EXPECT_FALSE(ChangeAgreed({1, 5}, 5));
}

TEST(ExecutionOrder, ChangeIsProposedByAllOnlyWhenEveryRankHasOne) {
  for (int n : {1, 2, 3, 7}) {
    for (int without = -1; without < n; ++without) {  // -1: every rank has one
      std::vector<std::vector<uint64_t>> per_rank;
      for (int r = 0; r < n; ++r) per_rank.push_back(EncodeOrderWords(r != without, 99, 1, {}));
      const auto w = AndAll(per_rank);
      EXPECT_EQ(ChangeProposedByAll(w), without < 0) << "n=" << n << " without=" << without;
      EXPECT_EQ(ChangeAgreed(w, 99), without < 0) << "n=" << n << " without=" << without;
    }
  }
}

TEST(ExecutionOrder, ChangeIsAgreedExactlyWhenEveryHashMatches) {
  std::mt19937_64 rng(12345);
  const int n = 4;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint64_t> hashes(n, rng());
    // Some trials differ on one rank: by a single bit, by a superset/subset of bits, or at random.
    const int odd_rank = trial % (n + 1) - 1;  // -1: all the same
    if (odd_rank >= 0) {
      const uint64_t base = hashes[odd_rank == 0 ? 1 : 0];  // what the other ranks have
      switch (trial % 3) {
        case 0:
          hashes[odd_rank] ^= uint64_t{1} << (trial % 64);
          break;
        case 1:
          hashes[odd_rank] |= rng() | 1;
          if (hashes[odd_rank] == base) hashes[odd_rank] = ~base;
          break;
        default:
          do {
            hashes[odd_rank] = rng();
          } while (hashes[odd_rank] == base);
      }
    }
    std::vector<std::vector<uint64_t>> per_rank;
    for (int r = 0; r < n; ++r) per_rank.push_back(EncodeOrderWords(true, hashes[r], 3, {}));
    const auto w = AndAll(per_rank);
    const bool all_same =
        std::all_of(hashes.begin(), hashes.end(), [&](uint64_t h) { return h == hashes[0]; });
    EXPECT_TRUE(ChangeProposedByAll(w));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ChangeAgreed(w, hashes[r]), all_same) << "trial " << trial << " rank " << r;
    }
  }
}

TEST(ExecutionOrder, TheAndGivesTheMinimumHeldRoundsOverTheMembers) {
  std::mt19937 rng(7);
  const int created = 4;  // sets with seq 1..3
  for (int n : {1, 2, 3, 5}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<std::vector<uint64_t>> per_rank;
      std::vector<int> expect(created, 64);  // by seq; 64: nobody limits it (all ones)
      for (int r = 0; r < n; ++r) {
        std::vector<HeldRounds> held;
        for (int seq = 1; seq < created; ++seq) {
          if (rng() % 4 == 0) continue;  // not a member: all ones, no limit
          const size_t rounds = rng() % 64;
          held.push_back({seq, rounds});
          expect[seq] = std::min(expect[seq], static_cast<int>(rounds));
        }
        per_rank.push_back(EncodeOrderWords(false, 0, created, held));
      }
      const auto w = AndAll(per_rank);
      for (int seq = 1; seq < created; ++seq) {
        EXPECT_EQ(ReleasableRounds(w, seq), expect[seq]) << "n=" << n << " seq=" << seq;
      }
    }
  }
}

TEST(ExecutionOrder, HeldRoundsAtTheLimit) {
  // 63 is the most a word can count; 64 and more saturate to all ones and so never hold the other
  // members back (never wrap to "none held", which would stall the set).
  for (size_t rounds : {size_t{62}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}}) {
    const auto w = EncodeOrderWords(false, 0, 2, {{1, rounds}});
    EXPECT_EQ(ReleasableRounds(w, 1), static_cast<int>(std::min<size_t>(rounds, 64))) << rounds;
    const auto other = EncodeOrderWords(false, 0, 2, {{1, 5}});
    EXPECT_EQ(ReleasableRounds(AndAll({w, other}), 1), 5) << rounds;
  }
}

TEST(ExecutionOrder, SetsTheWordsDoNotCoverReleaseNothing) {
  const int created = 3;  // words for seq 1 and 2 only
  const auto w = EncodeOrderWords(true, 5, created, {{1, 2}, {3, 9}, {10, 4}, {0, 8}, {-1, 8}});
  EXPECT_EQ(w.size(), 3u + (created - 1));
  EXPECT_EQ(ReleasableRounds(w, 1), 2);
  EXPECT_EQ(ReleasableRounds(w, 3), 0) << "seq beyond the words";
  EXPECT_EQ(ReleasableRounds(w, 10), 0) << "seq beyond the words";
  EXPECT_EQ(ReleasableRounds(w, 0), 0) << "the global set is never held";
  EXPECT_EQ(ReleasableRounds(w, -1), 0);
  EXPECT_TRUE(ChangeAgreed(w, 5)) << "entries out of range leave the change words alone";
}

TEST(ExecutionOrder, ASetNobodyHoldsIsAllOnes) {
  const auto w = EncodeOrderWords(false, 0, 3, {{1, 0}});
  EXPECT_EQ(ReleasableRounds(w, 1), 0) << "a member holding nothing releases nothing";
  EXPECT_EQ(ReleasableRounds(w, 2), 64) << "no entry: this rank does not limit the set";
}

}  // namespace
}  // namespace hvdc

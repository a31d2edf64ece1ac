// The ControlChannel contract (core/control_channel.h), written once and run over every control
// channel: BitAnd, Gather at rank 0 and Broadcast from rank 0 with results computed here, empty
// and large payloads, operations interleaved, and singleton channels completing at once. Process
// subsets (several channels progressed together) are in process_set_conformance.cc.
#include <string>
#include <vector>

#include "tests/cpp/conformance/control_channel_checks.h"
#include "tests/cpp/conformance/suite_util.h"

namespace hvdc {
namespace conformance {

namespace {

TEST_P(ControlChannelConformance, EveryOperation) {
  const int n = this->n();
  world().Run([n](Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    ASSERT_NE(set.control, nullptr);
    EXPECT_EQ(set.control->rank(), t.topology().rank);
    ExerciseChannel(*set.control, Range(0, n), 40);
  });
}

TEST_P(ControlChannelConformance, LargeAndEmptyPayloads) {
  const int n = this->n();
  world().Run([n](Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    if (!set.control) return;
    ControlChannel& ch = *set.control;
    const int r = ch.rank();
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{4096}, size_t{3} << 20}) {
      // Gather: only the last rank sends `bytes`, the others nothing.
      std::string mine(r == n - 1 ? bytes : 0, static_cast<char>('a' + r));
      std::vector<std::string> gathered;
      Status s = Wait(ch.StartGather(mine, &gathered));
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (r == 0) {
        EXPECT_EQ(static_cast<int>(gathered.size()), n);
        for (int q = 0; q < n && q < static_cast<int>(gathered.size()); ++q) {
          EXPECT_EQ(gathered[q], std::string(q == n - 1 ? bytes : 0, static_cast<char>('a' + q)));
        }
      }
      std::string blob = r == 0 ? std::string(bytes, 'z') : std::string(7, 'j');
      s = Wait(ch.StartBroadcast(&blob));
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(blob, std::string(bytes, 'z'));
    }
    std::vector<uint64_t> long_bits(4096, ~uint64_t{0});
    long_bits[r] = 0;
    EXPECT_TRUE(Wait(ch.StartBitAnd(&long_bits)).ok());
    for (int w = 0; w < 4096; ++w) {
      EXPECT_EQ(long_bits[w], w < n ? 0u : ~uint64_t{0}) << "word " << w;
    }
  });
}

// The negotiation's pattern: BitAnd, Gather, then Broadcast of what rank 0 made of the gather.
TEST_P(ControlChannelConformance, GatherThenBroadcastTheCombination) {
  const int n = this->n();
  world().Run([n](Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    if (!set.control) return;
    ControlChannel& ch = *set.control;
    const int r = ch.rank();
    for (int iter = 0; iter < 30; ++iter) {
      std::vector<uint64_t> bits = {BitWord(r, iter, 0), ~uint64_t{0}};
      EXPECT_TRUE(Wait(ch.StartBitAnd(&bits)).ok());
      uint64_t expected = ~uint64_t{0};
      for (int q = 0; q < n; ++q) expected &= BitWord(q, iter, 0);
      EXPECT_EQ(bits[0], expected);
      EXPECT_EQ(bits[1], ~uint64_t{0});
      std::vector<std::string> gathered;
      EXPECT_TRUE(Wait(ch.StartGather(Blob(r, iter), &gathered)).ok());
      std::string reply;
      if (r == 0) {
        for (const std::string& g : gathered) reply += g;
      }
      EXPECT_TRUE(Wait(ch.StartBroadcast(&reply)).ok());
      std::string want;
      for (int q = 0; q < n; ++q) want += Blob(q, iter);
      EXPECT_EQ(reply, want) << "iter " << iter;
    }
  });
}

// A channel of one member: every operation is complete at its first Test(), with the trivial
// result (the control thread never waits on a singleton set).
TEST_P(ControlChannelConformance, SingletonChannelsCompleteAtOnce) {
  const int n = this->n();
  world().Run([n](Transport& t) {
    std::vector<ProcessSetChannels> singles;
    for (int q = 0; q < n; ++q) singles.push_back(MakeSet(t, {q}));
    const int me = t.topology().rank;
    for (int q = 0; q < n; ++q) {
      ControlChannel* ch = singles[q].control.get();
      EXPECT_EQ(ch != nullptr, q == me) << "set {" << q << "}";
      if (!ch) continue;
      EXPECT_EQ(ch->rank(), 0);
      EXPECT_EQ(ch->size(), 1);
      Status s;
      std::vector<uint64_t> bits = {5, 7};
      EXPECT_TRUE(ch->StartBitAnd(&bits)->Test(&s));
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(bits, (std::vector<uint64_t>{5, 7}));
      std::vector<std::string> gathered;
      EXPECT_TRUE(ch->StartGather("abc", &gathered)->Test(&s));
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(gathered, std::vector<std::string>{"abc"});
      std::string blob = "keep";
      EXPECT_TRUE(ch->StartBroadcast(&blob)->Test(&s));
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(blob, "keep");
    }
  });
}

}  // namespace
}  // namespace conformance
}  // namespace hvdc

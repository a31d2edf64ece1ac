#include "tests/cpp/conformance/control_channel_checks.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/cpp/conformance/suite_util.h"

namespace hvdc {
namespace conformance {

uint64_t BitWord(int world_rank, int iter, size_t w) {
  // Each (rank, iter, word) clears one bit, so the AND over ranks is easy to state.
  return ~(uint64_t{1} << ((world_rank * 7 + iter * 3 + w) % 64));
}

std::string Blob(int world_rank, int iter) {
  const int len =
      (world_rank * 5 + iter * 3) % 7 == 0 ? 0 : (world_rank * 131 + iter * 17) % 300 + 1;
  std::string s(static_cast<size_t>(len), '\0');
  for (int i = 0; i < len; ++i) s[i] = static_cast<char>((world_rank * 31 + iter * 7 + i) & 0xff);
  return s;
}

void ExerciseChannel(ControlChannel& channel, const std::vector<int>& members, int iters) {
  const int n = static_cast<int>(members.size());
  const int me = channel.rank();
  EXPECT_EQ(channel.size(), n);
  for (int iter = 0; iter < iters; ++iter) {
    const size_t len = static_cast<size_t>(iter % 8);
    std::vector<uint64_t> bits(len);
    for (size_t w = 0; w < len; ++w) bits[w] = BitWord(members[me], iter, w);
    Status s = Wait(channel.StartBitAnd(&bits));
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(bits.size(), len);
    for (size_t w = 0; w < len && w < bits.size(); ++w) {
      uint64_t expected = ~uint64_t{0};
      for (int r : members) expected &= BitWord(r, iter, w);
      EXPECT_EQ(bits[w], expected) << "iter " << iter << " word " << w;
    }

    std::vector<std::string> gathered = {"stale"};
    s = Wait(channel.StartGather(Blob(members[me], iter), &gathered));
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (me == 0) {
      EXPECT_EQ(static_cast<int>(gathered.size()), n);
      for (int r = 0; r < n && r < static_cast<int>(gathered.size()); ++r) {
        EXPECT_EQ(gathered[r], Blob(members[r], iter)) << "from " << r << " iter " << iter;
      }
    } else {
      EXPECT_TRUE(gathered.empty()) << "iter " << iter;
    }

    // The others start with junk of another length.
    std::string blob = me == 0 ? Blob(members[0] + 1, iter) : std::string(me * 3 + 1, 'j');
    s = Wait(channel.StartBroadcast(&blob));
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(blob, Blob(members[0] + 1, iter)) << "iter " << iter;
  }
}

}  // namespace conformance
}  // namespace hvdc

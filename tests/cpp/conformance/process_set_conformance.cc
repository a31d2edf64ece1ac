// Process sets over every transport: a set that is not the whole world gets working channels on
// its members (ranked in set order, talking only among themselves) and null channels elsewhere;
// overlapping sets used one after another and with control operations outstanding on all of them
// at once; creating sets and checking agreement, including the errors every rank must see alike.
#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/cpp/conformance/control_channel_checks.h"
#include "tests/cpp/conformance/host_comm_checks.h"
#include "tests/cpp/conformance/suite_util.h"

namespace hvdc {
namespace conformance {
namespace {

// Everyone; singletons at both ends; the halves (overlapping when n is odd); the even ranks;
// everyone but rank 0.
std::vector<std::vector<int>> Subsets(int n) {
  std::vector<std::vector<int>> sets = {
      Range(0, n), {0}, {n - 1}, Range(0, (n + 1) / 2), Range(n / 2, n)};
  std::vector<int> even;
  for (int r = 0; r < n; r += 2) even.push_back(r);
  sets.push_back(even);
  if (n > 1) sets.push_back(Range(1, n));
  return sets;
}

int IndexOf(const std::vector<int>& v, int x) {
  auto it = std::find(v.begin(), v.end(), x);
  return it == v.end() ? -1 : static_cast<int>(it - v.begin());
}

TEST_P(ProcessSetConformance, SubsetsHaveChannelsOnlyOnMembers) {
  const int n = this->n();
  world().Run([n](Transport& t) {
    const int me = t.topology().rank;
    const auto sets = Subsets(n);
    std::vector<ProcessSetChannels> channels;
    for (const auto& members : sets) channels.push_back(MakeSet(t, members));
    // Sets in the same order on every rank, so overlapping ones cannot deadlock.
    for (size_t k = 0; k < sets.size(); ++k) {
      const std::vector<int>& members = sets[k];
      const int index = IndexOf(members, me);
      SCOPED_TRACE("set " + std::to_string(k));
      EXPECT_EQ(channels[k].control != nullptr, index >= 0);
      EXPECT_EQ(channels[k].data != nullptr, index >= 0);
      if (index < 0 || !channels[k].control || !channels[k].data) continue;
      const int m = static_cast<int>(members.size());
      HostComm& comm = *channels[k].data;
      EXPECT_EQ(comm.rank(), index);
      EXPECT_EQ(comm.size(), m);
      EXPECT_EQ(channels[k].control->rank(), index);
      ExerciseChannel(*channels[k].control, members, 8);
      for (DataType dtype : {DataType::kInt64, DataType::kFloat16, DataType::kBool}) {
        CheckAllreduce(comm, members, dtype, ReduceOp::kSum, 1003, false);
        CheckAllreduce(comm, members, dtype, ReduceOp::kMax, 5, true);
      }
      std::vector<int64_t> bytes(m), counts(m);
      for (int q = 0; q < m; ++q) {
        bytes[q] = q == 1 ? 0 : 5 + 7 * q;
        counts[q] = q == 0 ? 0 : 3 + q;
      }
      CheckAllgatherv(comm, members, bytes, false);
      for (int root = 0; root < m; ++root) CheckBroadcast(comm, members, root, 777);
      CheckAlltoallv(comm, members, [](int a, int b) { return int64_t{(a * 3 + b) % 4}; });
      CheckReduceScatter(comm, members, DataType::kFloat32, ReduceOp::kSum, counts, false);
      EXPECT_TRUE(comm.Barrier().ok());
    }
  });
}

// One BitAnd outstanding on every set of this rank at once, progressed together (the control
// thread does this across process sets).
TEST_P(ProcessSetConformance, ControlOperationsOnSeveralSetsAtOnce) {
  const int n = this->n();
  world().Run([n](Transport& t) {
    const int me = t.topology().rank;
    const auto sets = Subsets(n);
    std::vector<ProcessSetChannels> channels;
    for (const auto& members : sets) channels.push_back(MakeSet(t, members));
    for (int iter = 0; iter < 10; ++iter) {
      std::vector<std::vector<uint64_t>> bits(sets.size());
      std::vector<std::unique_ptr<PendingOp>> ops(sets.size());
      for (size_t k = 0; k < sets.size(); ++k) {
        if (!channels[k].control) continue;
        bits[k] = {~(uint64_t{1} << me), static_cast<uint64_t>(iter)};
        ops[k] = channels[k].control->StartBitAnd(&bits[k]);
      }
      for (bool pending = true; pending;) {
        pending = false;
        for (auto& op : ops) {
          Status s;
          if (!op) continue;
          if (op->Test(&s)) {
            EXPECT_TRUE(s.ok()) << s.ToString();
            op.reset();
          } else {
            pending = true;
          }
        }
        std::this_thread::yield();
      }
      for (size_t k = 0; k < sets.size(); ++k) {
        if (!channels[k].control) continue;
        uint64_t expected = ~uint64_t{0};
        for (int r : sets[k]) expected &= ~(uint64_t{1} << r);
        EXPECT_EQ(bits[k][0], expected) << "set " << k;
        EXPECT_EQ(bits[k][1], static_cast<uint64_t>(iter));
      }
    }
  });
}

TEST_P(ProcessSetConformance, BadListsFailAlikeAndLeaveTheWorldInStep) {
  const int n = this->n();
  world().Run([n](Transport& t) {
    const int me = t.topology().rank;
    ProcessSetChannels set;
    if (n > 1) {
      // Ranks disagree on the list.
      Status s = t.CreateProcessSet(me == 1 ? Range(0, 1) : Range(0, n), &set);
      EXPECT_EQ(s.code(), StatusCode::kPreconditionError) << s.ToString();
      EXPECT_EQ(set.control, nullptr);
      EXPECT_EQ(set.data, nullptr);
      s = t.CreateProcessSet({1, 0}, &set);  // not sorted
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    }
    for (const std::vector<int>& bad :
         {std::vector<int>{}, std::vector<int>{0, 0}, std::vector<int>{n}, std::vector<int>{-1}}) {
      Status s = t.CreateProcessSet(bad, &set);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      EXPECT_EQ(set.control, nullptr);
      EXPECT_EQ(set.data, nullptr);
    }
    set = MakeSet(t, Range(0, n));
    EXPECT_NE(set.data, nullptr);
    if (set.data)
      CheckAllreduce(*set.data, Range(0, n), DataType::kInt32, ReduceOp::kSum, 3, false);
  });
}

TEST_P(ProcessSetConformance, CheckAgreement) {
  const int n = this->n();
  world().Run([n](Transport& t) {
    const int me = t.topology().rank;
    for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0x8000000000000000ull}, ~uint64_t{0},
                       uint64_t{0x123456789abcdefull}}) {
      bool equal = false;
      EXPECT_TRUE(t.CheckAgreement(v, &equal).ok());
      EXPECT_TRUE(equal) << v;
      // One rank differs (the last, or rank 0), by one bit or by every bit.
      equal = n != 1;  // the opposite of the answer, so an unwritten result fails
      EXPECT_TRUE(t.CheckAgreement(me == n - 1 ? v ^ 1 : v, &equal).ok());
      EXPECT_EQ(equal, n == 1) << v;
      equal = n != 1;
      EXPECT_TRUE(t.CheckAgreement(me == 0 ? ~v : v, &equal).ok());
      EXPECT_EQ(equal, n == 1) << v;
    }
  });
}

}  // namespace
}  // namespace conformance
}  // namespace hvdc

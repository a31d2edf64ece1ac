// MessageTable and MergeRequests: a tensor is ready only once every rank that has not joined has
// submitted it; ready tensors come out in a deterministic order; ranks that disagree (op, dtype,
// device, shape, reduce op, scale factors, root, groups, splits) get an error response that names
// the tensor, both values and both (world) ranks; groups are released whole; stalls are reported.
#include "core/message_table.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

namespace hvdc {
namespace {

using Clock = MessageTable::Clock;

Request Req(const std::string& name, Shape shape = {4}, OpType op = OpType::kAllreduce) {
  Request q;
  q.op = op;
  q.name = name;
  q.shape = std::move(shape);
  return q;
}

std::vector<int> Iota(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

std::vector<std::string> NamesOf(const std::vector<Response>& ready) {
  std::vector<std::string> names;
  for (const Response& r : ready) names.push_back(r.name);
  return names;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(MessageTable, ReadyOnlyWhenEveryRankSubmitted) {
  const auto now = Clock::now();
  for (int n : {1, 2, 3, 5}) {
    MessageTable t(Iota(n));
    std::vector<Response> ready;
    for (int r = n - 1; r >= 0; --r) {  // any order of arrival
      t.Add(r, Req("x"), now, &ready);
      if (r > 0) {
        EXPECT_TRUE(ready.empty()) << "n=" << n << " after rank " << r;
        EXPECT_FALSE(t.empty());
      }
    }
    ASSERT_EQ(ready.size(), 1u) << n;
    EXPECT_EQ(ready[0].name, "x");
    EXPECT_EQ(ready[0].error_code, StatusCode::kOk) << ready[0].error_message;
    EXPECT_EQ(ready[0].shape, Shape{4});
    EXPECT_TRUE(t.empty());
  }
}

TEST(MessageTable, AResentRequestCountsOnce) {
  MessageTable t(Iota(3));
  std::vector<Response> ready;
  const auto now = Clock::now();
  t.Add(0, Req("x"), now, &ready);
  t.Add(0, Req("x"), now, &ready);
  t.Add(1, Req("x"), now, &ready);
  EXPECT_TRUE(ready.empty()) << "rank 2 has not submitted";
  t.Add(2, Req("x"), now, &ready);
  EXPECT_EQ(ready.size(), 1u);
}

TEST(MessageTable, TensorsAreReadyInTheOrderTheyComplete) {
  MessageTable t(Iota(2));
  std::vector<Response> ready;
  const auto now = Clock::now();
  for (const char* name : {"a", "b", "c"}) t.Add(0, Req(name), now, &ready);
  for (const char* name : {"c", "a", "b"}) t.Add(1, Req(name), now, &ready);
  EXPECT_EQ(NamesOf(ready), (std::vector<std::string>{"c", "a", "b"}));
}

// A joined rank counts as having submitted every tensor: what waited only for it is released by
// the join, in the order first seen; later tensors need only the other ranks.
TEST(MessageTable, JoinReleasesWhatWaitedForTheJoinedRank) {
  MessageTable t(Iota(3));
  std::vector<Response> ready;
  const auto now = Clock::now();
  EXPECT_FALSE(t.any_joined());
  EXPECT_EQ(t.last_joined(), -1);
  for (const char* name : {"b", "a", "c"}) t.Add(0, Req(name), now, &ready);
  for (const char* name : {"c", "a"}) t.Add(1, Req(name), now, &ready);  // not "b"
  ASSERT_TRUE(ready.empty());
  t.Join(2, &ready);
  EXPECT_EQ(NamesOf(ready), (std::vector<std::string>{"a", "c"})) << "first seen: b, a, c";
  EXPECT_TRUE(t.any_joined());
  EXPECT_FALSE(t.all_joined());
  EXPECT_EQ(t.last_joined(), 2);
  ready.clear();
  t.Join(2, &ready);  // twice: no effect
  EXPECT_TRUE(ready.empty());
  t.Add(0, Req("d"), now, &ready);
  t.Add(1, Req("d"), now, &ready);
  EXPECT_EQ(NamesOf(ready), (std::vector<std::string>{"d"}));
  ready.clear();
  t.Join(1, &ready);
  EXPECT_EQ(NamesOf(ready), (std::vector<std::string>{"b"}));
  EXPECT_EQ(t.last_joined(), 1);
  t.Join(0, &ready);
  EXPECT_TRUE(t.all_joined());
  EXPECT_EQ(t.last_joined(), 0);
  t.ResetJoin();
  EXPECT_FALSE(t.any_joined());
  EXPECT_EQ(t.last_joined(), -1);
}

TEST(MessageTable, OnlyAllreduceAndBarrierMayRunWhileARankHasJoined) {
  const auto now = Clock::now();
  for (OpType op : {OpType::kAllreduce, OpType::kBarrier, OpType::kBroadcast, OpType::kAllgather,
                    OpType::kReducescatter}) {
    MessageTable t(Iota(2));
    std::vector<Response> ready;
    t.Join(1, &ready);
    t.Add(0, Req("x", {4}, op), now, &ready);
    ASSERT_EQ(ready.size(), 1u);
    const bool allowed = op == OpType::kAllreduce || op == OpType::kBarrier;
    EXPECT_EQ(ready[0].error_code, allowed ? StatusCode::kOk : StatusCode::kPreconditionError)
        << OpTypeName(op);
    if (!allowed) {
      EXPECT_TRUE(Contains(ready[0].error_message, "joined")) << ready[0].error_message;
    }
  }
}

// Each mismatch between rank 0 and the last rank yields one error response for the tensor, with
// both values and both world ranks in the message.
TEST(MessageTable, MismatchesProduceErrorResponses) {
  struct Case {
    const char* what;
    std::function<void(Request*)> change;
    std::string value0, value1;
  };
  const std::vector<Case> cases = {
      {"operations", [](Request* q) { q->op = OpType::kBroadcast; }, "ALLREDUCE", "BROADCAST"},
      {"data types", [](Request* q) { q->dtype = DataType::kInt32; },
       DataTypeName(DataType::kFloat32), DataTypeName(DataType::kInt32)},
      {"devices", [](Request* q) { q->device = 0; }, "CPU", "GPU"},
      {"shapes", [](Request* q) { q->shape = {5}; }, "[4]", "[5]"},
      {"reduce operations", [](Request* q) { q->reduce_op = ReduceOp::kMax; },
       ReduceOpName(ReduceOp::kSum), ReduceOpName(ReduceOp::kMax)},
      {"prescale factors", [](Request* q) { q->prescale = 2.5; }, "1", "2.5"},
      {"postscale factors", [](Request* q) { q->postscale = 0.5; }, "1", "0.5"},
      {"groups",
       [](Request* q) {
         q->group = "g";
         q->group_size = 2;
       },
       "'' of 0", "'g' of 2"},
  };
  const std::vector<int> world = {3, 5, 8};  // set rank -> world rank
  for (const Case& c : cases) {
    MessageTable t(world);
    std::vector<Response> ready;
    const auto now = Clock::now();
    t.Add(0, Req("bad"), now, &ready);
    t.Add(1, Req("bad"), now, &ready);
    Request q = Req("bad");
    c.change(&q);
    t.Add(2, q, now, &ready);
    ASSERT_EQ(ready.size(), 1u) << c.what;
    const Response& p = ready[0];
    EXPECT_EQ(p.name, "bad");
    EXPECT_EQ(p.error_code, StatusCode::kPreconditionError) << c.what;
    const std::string want = "Mismatched " + std::string(c.what) + " for tensor 'bad': rank " +
                             std::to_string(world[0]) + " has " + c.value0 + ", rank " +
                             std::to_string(world[2]) + " has " + c.value1;
    EXPECT_EQ(p.error_message, want);
  }
}

TEST(MessageTable, BroadcastRootsMustAgree) {
  std::vector<Request> by_rank(2, Req("b", {4}, OpType::kBroadcast));
  by_rank[1].root_rank = 1;
  const Response p = MergeRequests("b", by_rank, {true, true});
  EXPECT_EQ(p.error_code, StatusCode::kPreconditionError);
  EXPECT_TRUE(Contains(p.error_message, "root ranks")) << p.error_message;
}

// Allgather and alltoall: the first dimension may differ, the rest must not.
TEST(MessageTable, GatherOpsCompareTrailingDimensions) {
  for (OpType op : {OpType::kAllgather, OpType::kAlltoall}) {
    std::vector<Request> by_rank = {Req("g", {2, 3}, op), Req("g", {5, 3}, op)};
    for (auto& q : by_rank) q.splits = {0, 0};
    EXPECT_EQ(MergeRequests("g", by_rank, {true, true}).error_code, StatusCode::kOk)
        << OpTypeName(op);
    by_rank[1].shape = {2, 4};
    Response p = MergeRequests("g", by_rank, {true, true});
    EXPECT_EQ(p.error_code, StatusCode::kPreconditionError);
    EXPECT_TRUE(Contains(p.error_message, "trailing dimensions")) << p.error_message;
    by_rank[1].shape = {2, 3, 1};
    p = MergeRequests("g", by_rank, {true, true});
    EXPECT_EQ(p.error_code, StatusCode::kPreconditionError);
    EXPECT_TRUE(Contains(p.error_message, "number of dimensions")) << p.error_message;
  }
}

TEST(MessageTable, AllgatherCollectsEveryRanksFirstDimension) {
  const int n = 4;
  MessageTable t(Iota(n));
  std::vector<Response> ready;
  std::vector<int64_t> want;
  for (int r = 0; r < n; ++r) {
    want.push_back(2 * r + 1);
    t.Add(r, Req("g", {want.back(), 3}, OpType::kAllgather), Clock::now(), &ready);
  }
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].error_code, StatusCode::kOk) << ready[0].error_message;
  EXPECT_EQ(ready[0].first_dims, want);
}

TEST(MessageTable, AlltoallConcatenatesEveryRanksSplits) {
  const int n = 3;
  MessageTable t(Iota(n));
  std::vector<Response> ready;
  std::vector<int32_t> want;
  for (int r = 0; r < n; ++r) {
    Request q = Req("a", {9}, OpType::kAlltoall);
    for (int c = 0; c < n; ++c) q.splits.push_back(r * n + c);
    want.insert(want.end(), q.splits.begin(), q.splits.end());
    t.Add(r, q, Clock::now(), &ready);
  }
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].splits, want);
  // A rank with the wrong number of splits: an error naming its world rank.
  std::vector<Request> by_rank(n, Req("a", {9}, OpType::kAlltoall));
  for (auto& q : by_rank) q.splits.assign(n, 3);
  by_rank[1].splits.pop_back();
  const std::vector<int> world = {4, 6, 9};
  const Response p = MergeRequests("a", by_rank, {true, true, true}, &world);
  EXPECT_EQ(p.error_code, StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(p.error_message, "rank 6 sent 2 splits")) << p.error_message;
}

TEST(MessageTable, UnsupportedReductionsAbort) {
  std::vector<Request> adasum(2, Req("x"));
  for (auto& q : adasum) q.reduce_op = ReduceOp::kAdasum;
  EXPECT_EQ(MergeRequests("x", adasum, {true, true}).error_code, StatusCode::kAborted);
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    std::vector<Request> rs(2, Req("r", {4}, OpType::kReducescatter));
    for (auto& q : rs) q.reduce_op = op;
    const bool ok = op == ReduceOp::kSum || op == ReduceOp::kAverage;
    EXPECT_EQ(MergeRequests("r", rs, {true, true}).error_code,
              ok ? StatusCode::kOk : StatusCode::kAborted)
        << ReduceOpName(op);
  }
}

// Members of a group are held back until every member is ready, then come out together.
TEST(MessageTable, GroupsAreReleasedWhole) {
  MessageTable t(Iota(2));
  std::vector<Response> ready;
  const auto now = Clock::now();
  std::vector<Request> members;
  for (const char* name : {"g0", "g1", "g2"}) {
    Request q = Req(name);
    q.group = "g0";
    q.group_size = 3;
    members.push_back(q);
  }
  for (const auto& q : members) t.Add(0, q, now, &ready);
  t.Add(1, members[2], now, &ready);
  t.Add(1, Req("loose"), now, &ready);  // not submitted by rank 0
  t.Add(1, members[0], now, &ready);
  EXPECT_TRUE(ready.empty()) << "g1 is not ready yet";
  t.Add(1, members[1], now, &ready);
  EXPECT_EQ(NamesOf(ready), (std::vector<std::string>{"g2", "g0", "g1"}));
}

// StalledSince reports tensors older than the age with the ranks that have and have not
// submitted them (a joined rank counts as having submitted).
TEST(MessageTable, StalledTensorsNameTheMissingRanks) {
  MessageTable t(Iota(4));
  std::vector<Response> ready;
  const auto t0 = Clock::now();
  t.Add(0, Req("old"), t0, &ready);
  t.Add(2, Req("old"), t0, &ready);
  t.Add(1, Req("new"), t0 + std::chrono::seconds(50), &ready);
  t.Join(3, &ready);
  const auto now = t0 + std::chrono::seconds(60);
  const auto stalled = t.StalledSince(std::chrono::seconds(30), now);
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_EQ(stalled[0].name, "old");
  EXPECT_DOUBLE_EQ(stalled[0].waited_s, 60.0);
  EXPECT_EQ(stalled[0].missing_ranks, std::vector<int>{1});
  EXPECT_EQ(stalled[0].ready_ranks, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(t.StalledSince(std::chrono::seconds(5), now).size(), 2u);
  EXPECT_TRUE(t.StalledSince(std::chrono::seconds(61), now).empty());
}

}  // namespace
}  // namespace hvdc

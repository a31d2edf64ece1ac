// ValidateRequest and ValidSetRanks: every op's checks against the process set a request is
// enqueued on, the completions it makes in place (broadcast root, alltoall splits, reserved names),
// and the set-membership rule. Expected values are computed from the set and the request.
#include "core/request_validator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

namespace hvdc {
namespace {

const std::vector<OpType> kAllOps = {OpType::kAllreduce, OpType::kAllgather,     OpType::kBroadcast,
                                     OpType::kAlltoall,  OpType::kReducescatter, OpType::kBarrier,
                                     OpType::kJoin};

Request Make(OpType op, const std::string& name, Shape shape) {
  Request q;
  q.op = op;
  q.name = name;
  q.shape = std::move(shape);
  return q;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A set of `n` ranks spread over a larger world: world ranks 1, 3, 5, ... (never 0..n-1, so a
// root given as a set index is distinguishable from one given as a world rank).
std::vector<int> OddRanks(int n) {
  std::vector<int> ranks(n);
  for (int i = 0; i < n; ++i) ranks[i] = 2 * i + 1;
  return ranks;
}

TEST(RequestValidator, ValidRequestsOfEveryOpPass) {
  const std::vector<int> ranks = {0, 1, 2, 3};
  const SetView set{0, &ranks};
  for (OpType op : kAllOps) {
    Request q = Make(op, "t", {8, 3});
    q.root_rank = ranks.back();
    const Status s = ValidateRequest(set, &q);
    EXPECT_TRUE(s.ok()) << OpTypeName(op) << ": " << s.ToString();
  }
}

TEST(RequestValidator, EmptyNameIsRefusedExceptForJoinAndBarrier) {
  const std::vector<int> ranks = {0, 1};
  const SetView set{0, &ranks};
  for (OpType op : kAllOps) {
    Request q = Make(op, "", {4});
    const Status s = ValidateRequest(set, &q);
    if (op == OpType::kJoin || op == OpType::kBarrier) {
      EXPECT_TRUE(s.ok()) << OpTypeName(op) << ": " << s.ToString();
    } else {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << OpTypeName(op);
      EXPECT_TRUE(Contains(s.message(), "name")) << s.message();
    }
  }
}

TEST(RequestValidator, JoinGetsItsReservedNameOnTheGlobalSet) {
  const std::vector<int> ranks = {0, 1, 2};
  Request q = Make(OpType::kJoin, "", {});
  ASSERT_TRUE(ValidateRequest({0, &ranks}, &q).ok());
  EXPECT_EQ(q.name, "join.noname");
  Request named = Make(OpType::kJoin, "whatever", {});
  ASSERT_TRUE(ValidateRequest({0, &ranks}, &named).ok());
  EXPECT_EQ(named.name, "join.noname") << "every rank's join must meet under one name";
}

TEST(RequestValidator, JoinOutsideTheGlobalSetIsRefused) {
  const std::vector<int> ranks = {0, 1};
  for (int id : {1, 2, 17}) {
    Request q = Make(OpType::kJoin, "", {});
    const Status s = ValidateRequest({id, &ranks}, &q);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "set " << id;
    EXPECT_TRUE(Contains(s.message(), "global")) << s.message();
  }
}

TEST(RequestValidator, BarrierKeepsItsNameOrGetsTheDefault) {
  const std::vector<int> ranks = {0, 1};
  Request unnamed = Make(OpType::kBarrier, "", {});
  ASSERT_TRUE(ValidateRequest({0, &ranks}, &unnamed).ok());
  EXPECT_EQ(unnamed.name, "barrier");
  Request named = Make(OpType::kBarrier, "my_barrier", {});
  ASSERT_TRUE(ValidateRequest({1, &ranks}, &named).ok());
  EXPECT_EQ(named.name, "my_barrier");
}

TEST(RequestValidator, BroadcastRootBecomesTheRankWithinTheSet) {
  for (int n : {1, 2, 3, 5}) {
    const std::vector<int> ranks = OddRanks(n);
    for (int i = 0; i < n; ++i) {
      Request q = Make(OpType::kBroadcast, "b", {4});
      q.root_rank = ranks[i];
      const Status s = ValidateRequest({1, &ranks}, &q);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(q.root_rank, i) << "world rank " << ranks[i] << " in a set of " << n;
    }
  }
}

TEST(RequestValidator, BroadcastRootOutsideTheSetIsRefused) {
  const std::vector<int> ranks = OddRanks(3);  // {1, 3, 5}
  for (int root : {-1, 0, 2, 4, 6, 100}) {
    Request q = Make(OpType::kBroadcast, "b", {4});
    q.root_rank = root;
    const Status s = ValidateRequest({2, &ranks}, &q);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "root " << root;
    EXPECT_TRUE(Contains(s.message(), "root rank " + std::to_string(root))) << s.message();
    EXPECT_TRUE(Contains(s.message(), "process set 2")) << s.message();
    EXPECT_EQ(q.root_rank, root) << "a refused request is not rewritten";
  }
}

TEST(RequestValidator, AlltoallWithoutSplitsGetsEqualSplits) {
  for (int n : {1, 2, 3, 4}) {
    const std::vector<int> ranks = OddRanks(n);
    for (int64_t rows_each : {0, 1, 5}) {
      const int64_t dim0 = rows_each * n;
      Request q = Make(OpType::kAlltoall, "a", {dim0, 2});
      const Status s = ValidateRequest({0, &ranks}, &q);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(q.splits.size(), static_cast<size_t>(n));
      for (int32_t split : q.splits) EXPECT_EQ(split, rows_each);
      EXPECT_EQ(std::accumulate(q.splits.begin(), q.splits.end(), int64_t{0}), dim0);
    }
  }
}

TEST(RequestValidator, AlltoallWithoutSplitsNeedsADivisibleFirstDimension) {
  const std::vector<int> ranks = {0, 1, 2};
  for (int64_t dim0 : {1, 2, 4, 7}) {
    Request q = Make(OpType::kAlltoall, "a", {dim0});
    const Status s = ValidateRequest({0, &ranks}, &q);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << dim0;
    EXPECT_TRUE(Contains(s.message(), "divisible")) << s.message();
    EXPECT_TRUE(q.splits.empty());
  }
}

TEST(RequestValidator, AlltoallSplitsAreChecked) {
  const std::vector<int> ranks = {0, 1, 2};
  const int64_t dim0 = 6;
  struct Case {
    std::vector<int32_t> splits;
    bool ok;
    const char* what;
  };
  const std::vector<Case> cases = {
      {{1, 2, 3}, true, ""},            // sum == dim0
      {{0, 0, 0}, true, ""},            // sending nothing is allowed
      {{1, 1, 1}, true, ""},            // sum < dim0: the rest is not sent
      {{2, 2, 3}, false, "more"},       // sum == dim0 + 1
      {{1, 2}, false, "splits"},        // one split short
      {{1, 2, 1, 1}, false, "splits"},  // one too many
      {{3, -1, 2}, false, "negative"},
  };
  for (const Case& c : cases) {
    Request q = Make(OpType::kAlltoall, "a", {dim0, 4});
    q.splits = c.splits;
    const Status s = ValidateRequest({0, &ranks}, &q);
    if (c.ok) {
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(q.splits, c.splits) << "given splits are kept";
    } else {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_TRUE(Contains(s.message(), c.what)) << s.message();
    }
  }
}

TEST(RequestValidator, OpsThatSplitTheFirstDimensionNeedOne) {
  const std::vector<int> ranks = {0, 1};
  for (OpType op : {OpType::kAlltoall, OpType::kAllgather, OpType::kReducescatter}) {
    Request q = Make(op, "scalar", {});
    const Status s = ValidateRequest({0, &ranks}, &q);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << OpTypeName(op);
    EXPECT_TRUE(Contains(s.message(), "at least one dimension")) << s.message();
  }
  for (OpType op : {OpType::kAllreduce, OpType::kBroadcast}) {
    Request q = Make(op, "scalar", {});
    EXPECT_TRUE(ValidateRequest({0, &ranks}, &q).ok()) << OpTypeName(op) << " of a scalar";
  }
}

TEST(RequestValidator, NegativeDimensionsAreRefusedForEveryOpWithATensor) {
  const std::vector<int> ranks = {0, 1};
  for (OpType op : {OpType::kAllreduce, OpType::kAllgather, OpType::kBroadcast, OpType::kAlltoall,
                    OpType::kReducescatter}) {
    for (const Shape& shape : {Shape{-1}, Shape{4, -2}, Shape{2, 3, -4}}) {
      Request q = Make(op, "neg", shape);
      q.splits = {0, 0};  // alltoall: valid splits, so only the dimension can be wrong
      const Status s = ValidateRequest({0, &ranks}, &q);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument)
          << OpTypeName(op) << " " << ShapeString(shape);
      // An alltoall with a negative first dimension already fails the splits check.
      if (op == OpType::kAlltoall && shape[0] < 0) continue;
      EXPECT_TRUE(Contains(s.message(), "negative")) << s.message();
      EXPECT_TRUE(Contains(s.message(), ShapeString(shape))) << s.message();
    }
  }
}

TEST(RequestValidator, ZeroSizedDimensionsAreFine) {
  const std::vector<int> ranks = {0, 1};
  for (OpType op : {OpType::kAllreduce, OpType::kAllgather, OpType::kBroadcast, OpType::kAlltoall,
                    OpType::kReducescatter}) {
    Request q = Make(op, "zero", {0, 3});
    EXPECT_TRUE(ValidateRequest({0, &ranks}, &q).ok()) << OpTypeName(op);
  }
}

TEST(RequestValidator, ValidSetRanks) {
  const int world = 4;
  EXPECT_FALSE(ValidSetRanks({}, world)) << "empty";
  EXPECT_FALSE(ValidSetRanks({1, 1}, world)) << "duplicate";
  EXPECT_FALSE(ValidSetRanks({0, 2, 2, 3}, world)) << "duplicate";
  EXPECT_FALSE(ValidSetRanks({-1, 0}, world)) << "negative";
  EXPECT_FALSE(ValidSetRanks({0, world}, world)) << "== world size";
  EXPECT_FALSE(ValidSetRanks({world + 3}, world)) << "beyond the world";
  // Every non-empty subset of the world (as a sorted list) is valid.
  for (int mask = 1; mask < (1 << world); ++mask) {
    std::vector<int> ranks;
    for (int r = 0; r < world; ++r) {
      if (mask & (1 << r)) ranks.push_back(r);
    }
    EXPECT_TRUE(ValidSetRanks(ranks, world)) << "mask " << mask;
  }
}

}  // namespace
}  // namespace hvdc

// Allgather, broadcast, alltoall, reducescatter, barrier and join under mpirun, through the C API
// only, on the global set and on process sets registered at init (hvdc_init_options). Inputs are
// f(rank, index); every expected value and shape is computed here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/c_api.h"
#include "tests/cpp/util/c_api_harness.h"

namespace hvdc_test {
namespace {

std::vector<int64_t> Concat(int64_t first, const std::vector<int64_t>& rest) {
  std::vector<int64_t> dims = {first};
  dims.insert(dims.end(), rest.begin(), rest.end());
  return dims;
}

// Elements of one dtype that make about 80 KiB: above HOROVOD_FUSION_THRESHOLD=65536.
int64_t LargeCount(int dtype) { return 80 * 1024 / static_cast<int64_t>(DtypeSize(dtype)) + 3; }

std::string DtypeParamName(const ::testing::TestParamInfo<int>& info) {
  return DtypeName(info.param);
}

// The process sets main() registered at init besides the global one, ascending by id.
struct SetInfo {
  int id;
  std::vector<int> ranks;
};

std::vector<SetInfo> ExtraSets() {
  std::vector<int32_t> ids(64, -1);
  const int n = hvdc_process_set_ids(ids.data(), 64);
  std::vector<SetInfo> sets;
  for (int k = 0; k < n && k < 64; ++k) {
    if (ids[k] != 0) sets.push_back({ids[k], SetRanks(ids[k])});
  }
  std::sort(sets.begin(), sets.end(),
            [](const SetInfo& a, const SetInfo& b) { return a.id < b.id; });
  return sets;
}

// ---------------------------------------------------------------------------------------------
// Allgather

// Allgathers rows_of(set rank) rows of shape `trailing` from every member of `members` (global
// ranks, in set-rank order) and checks shape and values.
void CheckAllgather(int dtype, int set_id, const std::vector<int>& members,
                    const std::function<int64_t(int)>& rows_of,
                    const std::vector<int64_t>& trailing, const std::string& name) {
  const int rank = hvdc_rank();
  const int me = IndexOf(members, rank);
  ASSERT_GE(me, 0);
  const int64_t row_elems = NumElements(trailing);
  const int64_t my_rows = rows_of(me);
  auto mine = [&](int64_t i) { return MoveValue(dtype, rank, i); };
  Buffer input(dtype, my_rows * row_elems, mine);
  Output out(dtype);
  hvdc_request req = NewRequest(HVDC_OP_ALLGATHER, name.c_str(), set_id);
  req.input = TensorOf(input, Concat(my_rows, trailing));
  out.AttachTo(&req);
  const Result r = RunSync(req);
  ASSERT_TRUE(IsOk(r)) << name;
  EXPECT_EQ(out.calls(), 1) << name;
  int64_t total_rows = 0;
  std::vector<double> expected;
  for (size_t m = 0; m < members.size(); ++m) {
    const int64_t rows = rows_of(static_cast<int>(m));
    total_rows += rows;
    for (int64_t i = 0; i < rows * row_elems; ++i)
      expected.push_back(MoveValue(dtype, members[m], i));
  }
  ASSERT_EQ(out.dims(), Concat(total_rows, trailing)) << name;
  EXPECT_TRUE(BufferMatches(
      out.buffer(), [&](int64_t j) { return expected[j]; }, name));
  EXPECT_TRUE(BufferMatches(input, mine, name + " input (must be unchanged)"));
}

class AllgatherDtypes : public ::testing::TestWithParam<int> {};

TEST_P(AllgatherDtypes, RankPlusOneRows) {
  CheckAllgather(
      GetParam(), 0, WorldRanks(), [](int r) { return r + 1; }, {3, 2}, TestName());
}

TEST_P(AllgatherDtypes, ZeroRowsOnRankOne) {
  CheckAllgather(
      GetParam(), 0, WorldRanks(), [](int r) { return r == 1 ? 0 : r + 2; }, {4}, TestName());
}

TEST_P(AllgatherDtypes, OneDimensional) {
  CheckAllgather(
      GetParam(), 0, WorldRanks(), [](int r) { return 3 * r + 1; }, {}, TestName());
}

TEST_P(AllgatherDtypes, AboveFusionThreshold) {
  const int dtype = GetParam();
  const int64_t row_elems = 16;
  const int64_t rows = LargeCount(dtype) / row_elems;
  CheckAllgather(
      dtype, 0, WorldRanks(), [&](int r) { return rows + 5 * r; }, {row_elems}, TestName());
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, AllgatherDtypes, ::testing::ValuesIn(AllDtypes()),
                         DtypeParamName);

TEST(Allgather, ZeroRowsEverywhere) {
  CheckAllgather(
      HVDC_FLOAT32, 0, WorldRanks(), [](int) { return 0; }, {5}, TestName());
}

// Many allgathers in flight, issued in a different order on every rank.
TEST(Allgather, ManyInFlightDifferentOrder) {
  const int rank = hvdc_rank();
  const int size = hvdc_size();
  constexpr int kTensors = 24;
  const int dtypes[] = {HVDC_FLOAT32, HVDC_INT8, HVDC_FLOAT64, HVDC_UINT16, HVDC_BOOL, HVDC_INT64};
  struct Item {
    int dtype;
    int64_t rows_base;
    std::unique_ptr<Buffer> input;
    std::unique_ptr<Output> out;
    std::string name;
  };
  std::vector<Item> items(kTensors);
  for (int t = 0; t < kTensors; ++t) {
    Item& it = items[t];
    it.dtype = dtypes[t % 6];
    it.rows_base = t % 4;
    const int64_t rows = it.rows_base + (rank + t) % 3;
    it.input = std::make_unique<Buffer>(
        it.dtype, rows * 3, [&](int64_t i) { return MoveValue(it.dtype, rank, i + t); });
    it.out = std::make_unique<Output>(it.dtype);
    it.name = TestName("t" + std::to_string(t));
  }
  std::vector<int> order = Range(kTensors);
  std::mt19937 rng(static_cast<unsigned>(rank + 11));
  std::shuffle(order.begin(), order.end(), rng);
  Batch batch;
  for (int t : order) {
    Item& it = items[t];
    hvdc_request req = NewRequest(HVDC_OP_ALLGATHER, it.name.c_str());
    req.input = TensorOf(*it.input, {it.input->count() / 3, 3});
    it.out->AttachTo(&req);
    batch.Add(req);
  }
  const std::vector<Result> results = batch.WaitAll();
  for (size_t k = 0; k < order.size(); ++k) {
    const int t = order[k];
    const Item& it = items[t];
    EXPECT_TRUE(IsOk(results[k])) << it.name;
    std::vector<double> expected;
    for (int r = 0; r < size; ++r) {
      const int64_t rows = it.rows_base + (r + t) % 3;
      for (int64_t i = 0; i < rows * 3; ++i) expected.push_back(MoveValue(it.dtype, r, i + t));
    }
    EXPECT_EQ(it.out->dims(), (std::vector<int64_t>{static_cast<int64_t>(expected.size()) / 3, 3}))
        << it.name;
    if (it.out->buffer().count() == static_cast<int64_t>(expected.size())) {
      EXPECT_TRUE(BufferMatches(
          it.out->buffer(), [&](int64_t j) { return expected[j]; }, it.name));
    }
  }
}

// A group of allgathers in one hvdc_enqueue.
TEST(Allgather, Grouped) {
  const int rank = hvdc_rank();
  const int size = hvdc_size();
  constexpr int kMembers = 3;
  std::vector<std::unique_ptr<Buffer>> inputs;
  std::vector<std::unique_ptr<Output>> outs;
  std::vector<std::string> names;
  std::vector<hvdc_request> reqs;
  for (int k = 0; k < kMembers; ++k) {
    names.push_back(TestName(std::to_string(k + 1) + "of" + std::to_string(kMembers)));
  }
  for (int k = 0; k < kMembers; ++k) {
    const int64_t rows = rank + k;
    inputs.push_back(std::make_unique<Buffer>(
        HVDC_INT32, rows * 2, [&](int64_t i) { return MoveValue(HVDC_INT32, rank, i + 100 * k); }));
    outs.push_back(std::make_unique<Output>(HVDC_INT32));
    hvdc_request req = NewRequest(HVDC_OP_ALLGATHER, names[k].c_str());
    req.input = TensorOf(*inputs[k], {rows, 2});
    outs[k]->AttachTo(&req);
    reqs.push_back(req);
  }
  ASSERT_TRUE(IsOk(RunGroup(reqs)));
  for (int k = 0; k < kMembers; ++k) {
    std::vector<double> expected;
    for (int r = 0; r < size; ++r) {
      for (int64_t i = 0; i < (r + k) * 2; ++i)
        expected.push_back(MoveValue(HVDC_INT32, r, i + 100 * k));
    }
    EXPECT_EQ(outs[k]->dims(),
              (std::vector<int64_t>{static_cast<int64_t>(expected.size()) / 2, 2}));
    if (outs[k]->buffer().count() == static_cast<int64_t>(expected.size())) {
      EXPECT_TRUE(BufferMatches(
          outs[k]->buffer(), [&](int64_t j) { return expected[j]; }, names[k]));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Broadcast

// Broadcasts from every member of `members` in turn (root_rank is a global rank).
void CheckBroadcastFromEveryRoot(int dtype, int set_id, const std::vector<int>& members, int64_t n,
                                 bool in_place, const std::string& name_prefix) {
  const int rank = hvdc_rank();
  for (int root : members) {
    auto mine = [&](int64_t i) { return MoveValue(dtype, rank, i); };
    Buffer input(dtype, n, mine);
    Buffer output(dtype, n);
    output.Poison();
    Buffer& out = in_place ? input : output;
    const std::string name = name_prefix + ".root" + std::to_string(root);
    hvdc_request req = NewRequest(HVDC_OP_BROADCAST, name.c_str(), set_id);
    req.input = TensorOf(input, {n});
    req.output = TensorOf(out, {n});
    req.root_rank = root;
    const Result r = RunSync(req);
    EXPECT_TRUE(IsOk(r)) << name;
    EXPECT_TRUE(BufferMatches(
        out, [&](int64_t i) { return MoveValue(dtype, root, i); }, name + " result"));
    if (!in_place) {
      EXPECT_TRUE(BufferMatches(input, mine, name + " input (must be unchanged)"));
    }
  }
}

struct BroadcastCase {
  int dtype;
  int count_kind;  // 0: one element, 1: 17, 2: above the fusion threshold
  bool in_place;
};

std::vector<BroadcastCase> BroadcastCases() {
  std::vector<BroadcastCase> cases;
  for (int dtype : AllDtypes()) {
    for (int kind = 0; kind < 3; ++kind) {
      for (bool in_place : {false, true}) cases.push_back({dtype, kind, in_place});
    }
  }
  return cases;
}

class BroadcastMatrix : public ::testing::TestWithParam<BroadcastCase> {};

TEST_P(BroadcastMatrix, EveryRoot) {
  const BroadcastCase& c = GetParam();
  const int64_t n = c.count_kind == 0 ? 1 : c.count_kind == 1 ? 17 : LargeCount(c.dtype);
  CheckBroadcastFromEveryRoot(c.dtype, 0, WorldRanks(), n, c.in_place, TestName());
}

std::string BroadcastCaseName(const ::testing::TestParamInfo<BroadcastCase>& info) {
  const BroadcastCase& c = info.param;
  static const char* const kCounts[] = {"n1", "n17", "large"};
  return std::string(DtypeName(c.dtype)) + "_" + kCounts[c.count_kind] +
         (c.in_place ? "_inplace" : "_outofplace");
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, BroadcastMatrix, ::testing::ValuesIn(BroadcastCases()),
                         BroadcastCaseName);

TEST(Broadcast, MultiDimensionalAndEmpty) {
  const int rank = hvdc_rank();
  const int root = hvdc_size() - 1;
  for (const std::vector<int64_t>& dims :
       {std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{0, 3}, std::vector<int64_t>{}}) {
    Buffer buf(HVDC_FLOAT64, NumElements(dims),
               [&](int64_t i) { return MoveValue(HVDC_FLOAT64, rank, i); });
    const std::string name = TestName(DimsString(dims));
    hvdc_request req = NewRequest(HVDC_OP_BROADCAST, name.c_str());
    req.input = TensorOf(buf, dims);
    req.output = req.input;
    req.root_rank = root;
    EXPECT_TRUE(IsOk(RunSync(req))) << name;
    EXPECT_TRUE(BufferMatches(
        buf, [&](int64_t i) { return MoveValue(HVDC_FLOAT64, root, i); }, name));
  }
}

// ---------------------------------------------------------------------------------------------
// Alltoall

// splits(src, dst): rows set rank `src` sends to set rank `dst`; `explicit_splits` false passes
// NULL (the runtime splits dim 0 evenly, so splits must then be constant).
void CheckAlltoall(int dtype, int set_id, const std::vector<int>& members,
                   const std::function<int32_t(int, int)>& splits, bool explicit_splits,
                   const std::vector<int64_t>& trailing, const std::string& name) {
  const int rank = hvdc_rank();
  const int me = IndexOf(members, rank);
  ASSERT_GE(me, 0);
  const int s = static_cast<int>(members.size());
  const int64_t row_elems = NumElements(trailing);
  std::vector<int32_t> my_splits(s);
  int64_t my_rows = 0;
  for (int d = 0; d < s; ++d) {
    my_splits[d] = splits(me, d);
    my_rows += my_splits[d];
  }
  auto mine = [&](int64_t i) { return MoveValue(dtype, rank, i); };
  Buffer input(dtype, my_rows * row_elems, mine);
  Output out(dtype);
  std::vector<int32_t> received(s, -7);
  hvdc_request req = NewRequest(HVDC_OP_ALLTOALL, name.c_str(), set_id);
  req.input = TensorOf(input, Concat(my_rows, trailing));
  if (explicit_splits) {
    req.splits = my_splits.data();
    req.num_splits = s;
  }
  req.received_splits = received.data();
  out.AttachTo(&req);
  const Result r = RunSync(req);
  ASSERT_TRUE(IsOk(r)) << name;
  EXPECT_EQ(out.calls(), 1);

  std::vector<int32_t> want_received(s);
  std::vector<double> expected;
  for (int src = 0; src < s; ++src) {
    int64_t offset = 0;  // rows of src's input before the block for me
    for (int d = 0; d < me; ++d) offset += splits(src, d);
    want_received[src] = splits(src, me);
    for (int64_t i = 0; i < want_received[src] * row_elems; ++i) {
      expected.push_back(MoveValue(dtype, members[src], offset * row_elems + i));
    }
  }
  EXPECT_EQ(received, want_received) << name;
  ASSERT_EQ(
      out.dims(),
      Concat(static_cast<int64_t>(expected.size()) / std::max<int64_t>(row_elems, 1), trailing))
      << name;
  EXPECT_TRUE(BufferMatches(
      out.buffer(), [&](int64_t j) { return expected[j]; }, name));
  EXPECT_TRUE(BufferMatches(input, mine, name + " input (must be unchanged)"));
}

enum SplitPattern { kUneven, kRankZeroSendsNothing, kNothingToSelf, kEvenExplicit, kEvenNull };

const char* SplitPatternName(int p) {
  switch (p) {
    case kUneven:
      return "Uneven";
    case kRankZeroSendsNothing:
      return "RankZeroSendsNothing";
    case kNothingToSelf:
      return "NothingToSelf";
    case kEvenExplicit:
      return "EvenExplicit";
    case kEvenNull:
      return "EvenNullSplits";
  }
  return "?";
}

int32_t PatternSplit(int pattern, int src, int dst) {
  switch (pattern) {
    case kUneven:
      return (src + 2 * dst) % 3;
    case kRankZeroSendsNothing:
      return src == 0 ? 0 : dst + 1;
    case kNothingToSelf:
      return src == dst ? 0 : 2;
    case kEvenExplicit:
    case kEvenNull:
      return 2;
  }
  return 0;
}

class AlltoallMatrix : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(AlltoallMatrix, Splits) {
  const int dtype = std::get<0>(GetParam());
  const int pattern = std::get<1>(GetParam());
  CheckAlltoall(
      dtype, 0, WorldRanks(), [&](int src, int dst) { return PatternSplit(pattern, src, dst); },
      pattern != kEvenNull, {2}, TestName());
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, AlltoallMatrix,
                         ::testing::Combine(::testing::ValuesIn(AllDtypes()),
                                            ::testing::Values(kUneven, kRankZeroSendsNothing,
                                                              kNothingToSelf, kEvenExplicit,
                                                              kEvenNull)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
                           return std::string(DtypeName(std::get<0>(info.param))) + "_" +
                                  SplitPatternName(std::get<1>(info.param));
                         });

TEST(Alltoall, AboveFusionThreshold) {
  CheckAlltoall(
      HVDC_FLOAT32, 0, WorldRanks(), [](int src, int dst) { return 400 + 10 * src + dst; }, true,
      {16}, TestName());
}

TEST(Alltoall, OneDimensional) {
  CheckAlltoall(
      HVDC_INT64, 0, WorldRanks(), [](int src, int dst) { return (src * dst + 1) % 4; }, true, {},
      TestName());
}

// ---------------------------------------------------------------------------------------------
// Reducescatter

// Rank r (set rank `me` of s) keeps rows [start, start + rows) of the reduction of n rows, where
// ranks me < n % s get n / s + 1 rows and the rest n / s.
void CheckReducescatter(int dtype, int op, int set_id, const std::vector<int>& members, int64_t n,
                        const std::vector<int64_t>& trailing, double prescale, double postscale,
                        const std::string& name) {
  const int rank = hvdc_rank();
  const int me = IndexOf(members, rank);
  ASSERT_GE(me, 0);
  const int64_t s = static_cast<int64_t>(members.size());
  const int64_t row_elems = NumElements(trailing);
  auto mine = [&](int64_t i) { return ReduceInput(dtype, op, rank, i); };
  Buffer input(dtype, n * row_elems, mine);
  Output out(dtype);
  hvdc_request req = NewRequest(HVDC_OP_REDUCESCATTER, name.c_str(), set_id);
  req.input = TensorOf(input, Concat(n, trailing));
  req.reduce_op = op;
  req.prescale_factor = prescale;
  req.postscale_factor = postscale;
  out.AttachTo(&req);
  const Result r = RunSync(req);
  ASSERT_TRUE(IsOk(r)) << name;
  EXPECT_EQ(out.calls(), 1);
  const int64_t my_rows = n / s + (me < n % s ? 1 : 0);
  const int64_t start = me * (n / s) + std::min<int64_t>(me, n % s);
  ASSERT_EQ(out.dims(), Concat(my_rows, trailing)) << name << " (n = " << n << ", s = " << s << ")";
  EXPECT_TRUE(BufferMatches(
      out.buffer(),
      [&](int64_t j) {
        return ReduceExpected(dtype, op, members, start * row_elems + j, prescale, postscale);
      },
      name));
  EXPECT_TRUE(BufferMatches(input, mine, name + " input (must be unchanged)"));
}

enum RowsKind { kRows0, kRows1, kRowsOneExtra, kRowsMaxExtra, kRowsLarge };

int64_t ReducescatterRows(int kind, int dtype, int64_t s) {
  switch (kind) {
    case kRows0:
      return 0;
    case kRows1:
      return 1;
    case kRowsOneExtra:
      return 3 * s + 1;
    case kRowsMaxExtra:
      return 4 * s - 1;
    case kRowsLarge:
      return LargeCount(dtype) / 3 + 1;
  }
  return 0;
}

const char* RowsKindName(int kind) {
  const char* names[] = {"rows0", "rows1", "rows3sPlus1", "rows4sMinus1", "large"};
  return names[kind];
}

class ReducescatterMatrix : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(ReducescatterMatrix, RowsSplitAcrossRanks) {
  const int dtype = std::get<0>(GetParam());
  const int op = std::get<1>(GetParam());
  const int kind = std::get<2>(GetParam());
  CheckReducescatter(dtype, op, 0, WorldRanks(), ReducescatterRows(kind, dtype, hvdc_size()), {3},
                     1.0, 1.0, TestName());
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, ReducescatterMatrix,
    ::testing::Combine(::testing::Values(HVDC_INT32, HVDC_INT64, HVDC_FLOAT16, HVDC_BFLOAT16,
                                         HVDC_FLOAT32, HVDC_FLOAT64),
                       ::testing::Values(HVDC_SUM, HVDC_AVERAGE),
                       ::testing::Values(kRows0, kRows1, kRowsOneExtra, kRowsMaxExtra, kRowsLarge)),
    [](const ::testing::TestParamInfo<std::tuple<int, int, int>>& info) {
      return std::string(DtypeName(std::get<0>(info.param))) + "_" +
             ReduceOpName(std::get<1>(info.param)) + "_" + RowsKindName(std::get<2>(info.param));
    });

TEST(Reducescatter, ScaleFactors) {
  const int64_t s = hvdc_size();
  for (int dtype : {HVDC_FLOAT16, HVDC_FLOAT32, HVDC_FLOAT64}) {
    for (int op : {HVDC_SUM, HVDC_AVERAGE}) {
      for (const auto& f :
           {std::pair<double, double>{0.5, 3.0}, std::pair<double, double>{3.0, 0.25}}) {
        const std::string name =
            TestName(std::string(DtypeName(dtype)) + "_" + ReduceOpName(op) + "_" +
                     std::to_string(f.first) + "_" + std::to_string(f.second));
        CheckReducescatter(dtype, op, 0, WorldRanks(), 3 * s + 1, {2}, f.first, f.second, name);
        CheckReducescatter(dtype, op, 0, WorldRanks(), LargeCount(dtype) / 2, {2}, f.first,
                           f.second, name + "_large");
      }
    }
  }
}

TEST(Reducescatter, Grouped) {
  const int rank = hvdc_rank();
  const std::vector<int> ranks = WorldRanks();
  const int64_t s = hvdc_size();
  const int me = rank;
  const int64_t rows[] = {2 * s + 1, 5, s};
  constexpr int kMembers = 3;
  std::vector<std::unique_ptr<Buffer>> inputs;
  std::vector<std::unique_ptr<Output>> outs;
  std::vector<std::string> names;
  std::vector<hvdc_request> reqs;
  for (int k = 0; k < kMembers; ++k) {
    names.push_back(TestName(std::to_string(k + 1) + "of" + std::to_string(kMembers)));
  }
  for (int k = 0; k < kMembers; ++k) {
    inputs.push_back(std::make_unique<Buffer>(HVDC_FLOAT32, rows[k] * 4, [&](int64_t i) {
      return ReduceInput(HVDC_FLOAT32, HVDC_SUM, rank, i + k);
    }));
    outs.push_back(std::make_unique<Output>(HVDC_FLOAT32));
    hvdc_request req = NewRequest(HVDC_OP_REDUCESCATTER, names[k].c_str());
    req.input = TensorOf(*inputs[k], {rows[k], 4});
    req.reduce_op = HVDC_SUM;
    outs[k]->AttachTo(&req);
    reqs.push_back(req);
  }
  ASSERT_TRUE(IsOk(RunGroup(reqs)));
  for (int k = 0; k < kMembers; ++k) {
    const int64_t n = rows[k];
    const int64_t my_rows = n / s + (me < n % s ? 1 : 0);
    const int64_t start = me * (n / s) + std::min<int64_t>(me, n % s);
    EXPECT_EQ(outs[k]->dims(), (std::vector<int64_t>{my_rows, 4})) << names[k];
    if (outs[k]->buffer().count() == my_rows * 4) {
      EXPECT_TRUE(BufferMatches(
          outs[k]->buffer(),
          [&](int64_t j) {
            return ReduceExpected(HVDC_FLOAT32, HVDC_SUM, ranks, start * 4 + j + k);
          },
          names[k]));
    }
  }
}

// Only Sum and Average scatter; the coordinator aborts the others, and the runtime goes on.
TEST(Reducescatter, MinMaxProductAborted) {
  const int rank = hvdc_rank();
  for (int op : {HVDC_MIN, HVDC_MAX, HVDC_PRODUCT}) {
    Buffer input(HVDC_FLOAT32, 6 * 2,
                 [&](int64_t i) { return ReduceInput(HVDC_FLOAT32, op, rank, i); });
    Output out(HVDC_FLOAT32);
    const std::string name = TestName(ReduceOpName(op));
    hvdc_request req = NewRequest(HVDC_OP_REDUCESCATTER, name.c_str());
    req.input = TensorOf(input, {6, 2});
    req.reduce_op = op;
    out.AttachTo(&req);
    EXPECT_TRUE(IsError(RunSync(req), HVDC_ABORTED, {name}));
  }
  CheckReducescatter(HVDC_FLOAT32, HVDC_SUM, 0, WorldRanks(), 7, {2}, 1.0, 1.0,
                     TestName("afterwards"));
}

TEST(Reducescatter, ScalarRejected) {
  Buffer scalar(HVDC_FLOAT32, 1, [](int64_t) { return 1.0; });
  Output out(HVDC_FLOAT32);
  const std::string name = TestName();
  hvdc_request req = NewRequest(HVDC_OP_REDUCESCATTER, name.c_str());
  req.input = TensorOf(scalar, {});
  req.reduce_op = HVDC_SUM;
  out.AttachTo(&req);
  const Result r = RunSync(req);
  EXPECT_TRUE(r.code == HVDC_INVALID_ARGUMENT || r.code == HVDC_PRECONDITION_ERROR) << r;
  EXPECT_TRUE(ContainsNoCase(r.message, name)) << r;
  CheckReducescatter(HVDC_FLOAT32, HVDC_SUM, 0, WorldRanks(), 4, {1}, 1.0, 1.0,
                     TestName("afterwards"));
}

// ---------------------------------------------------------------------------------------------
// Barrier

Result Barrier(const std::string& name, int set_id = 0) {
  return RunSync(NewRequest(HVDC_OP_BARRIER, name.c_str(), set_id));
}

// Every member writes a marker file before the barrier (one of them late); after the barrier every
// member must see all markers. The directory token comes from rank 0 by broadcast.
void CheckBarrierOrders(int set_id, const std::vector<int>& members, const std::string& prefix) {
  const int rank = hvdc_rank();
  Buffer token(HVDC_INT64, 1, [](int64_t) { return static_cast<double>(getpid()); });
  const std::string token_name = prefix + ".token";
  hvdc_request bcast = NewRequest(HVDC_OP_BROADCAST, token_name.c_str(), set_id);
  bcast.input = TensorOf(token, {1});
  bcast.output = bcast.input;
  bcast.root_rank = members[0];
  ASSERT_TRUE(IsOk(RunSync(bcast)));
  const std::string dir = "/tmp/hvdc_barrier_" +
                          std::to_string(static_cast<int64_t>(token.Get(0))) + "_set" +
                          std::to_string(set_id) + "_";
  auto marker = [&](int round, int r) {
    return dir + std::to_string(round) + "_" + std::to_string(r);
  };
  constexpr int kRounds = 3;
  for (int round = 0; round < kRounds; ++round) {
    // The late member differs per round; the sleep only makes a broken barrier likely to show.
    if (rank == members[round % members.size()]) {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
    }
    FILE* f = std::fopen(marker(round, rank).c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
    EXPECT_TRUE(IsOk(Barrier(prefix + ".round" + std::to_string(round), set_id)));
    for (int m : members) {
      EXPECT_EQ(access(marker(round, m).c_str(), F_OK), 0)
          << "round " << round << ": rank " << m << " had not reached the barrier";
    }
  }
  EXPECT_TRUE(IsOk(Barrier(prefix + ".cleanup", set_id)));
  for (int round = 0; round < kRounds; ++round) std::remove(marker(round, rank).c_str());
}

TEST(Barrier, NobodyLeavesEarly) { CheckBarrierOrders(0, WorldRanks(), TestName()); }

// ---------------------------------------------------------------------------------------------
// Join

Result Join(int32_t* last_rank) {
  hvdc_request req = NewRequest(HVDC_OP_JOIN, "join.noname");
  req.join_last_rank = last_rank;
  return RunSync(req);
}

// The last rank joins at once. Rank r < size - 1 runs allreduce stages 0..r and then joins. Stage k
// completes only once ranks 0..k-1 (which never submit it) have joined, so the join order is
// size-1, 0, 1, ..., size-2, the live ranks of stage k are k..size-2, and the joined ones
// contribute zeros.
TEST(Join, JoinedRanksContributeZeros) {
  const int rank = hvdc_rank();
  const int size = hvdc_size();
  if (size < 2) GTEST_SKIP() << "needs a rank that joins while others still reduce";
  if (rank < size - 1) {
    for (int k = 0; k <= rank; ++k) {
      std::vector<int> live;
      for (int r = k; r <= size - 2; ++r) live.push_back(r);
      for (int dtype : {HVDC_FLOAT32, HVDC_INT32}) {
        for (int64_t n : {int64_t{17}, LargeCount(dtype)}) {
          Buffer buf(dtype, n, [&](int64_t i) { return ReduceInput(dtype, HVDC_SUM, rank, i); });
          const std::string name = TestName("stage" + std::to_string(k) + "_" + DtypeName(dtype) +
                                            "_" + std::to_string(n));
          EXPECT_TRUE(IsOk(RunSync(AllreduceRequest(name.c_str(), buf, buf, {n}, HVDC_SUM))))
              << name;
          EXPECT_TRUE(BufferMatches(
              buf, [&](int64_t i) { return ReduceExpected(dtype, HVDC_SUM, live, i); }, name));
        }
      }
    }
  }
  int32_t last = -5;
  EXPECT_TRUE(IsOk(Join(&last)));
  EXPECT_EQ(last, size - 2) << "join order is size-1, 0, ..., size-2";

  // Everyone is back: a normal allreduce over all ranks.
  Buffer buf(HVDC_FLOAT32, 9,
             [&](int64_t i) { return ReduceInput(HVDC_FLOAT32, HVDC_SUM, rank, i); });
  const std::string name = TestName("after");
  EXPECT_TRUE(IsOk(RunSync(AllreduceRequest(name.c_str(), buf, buf, {9}, HVDC_SUM))));
  EXPECT_TRUE(BufferMatches(
      buf, [&](int64_t i) { return ReduceExpected(HVDC_FLOAT32, HVDC_SUM, WorldRanks(), i); }));
}

// While a rank is joined, allgather and broadcast are rejected; allreduce still works.
TEST(Join, AllgatherAndBroadcastRejectedWhileJoined) {
  const int rank = hvdc_rank();
  const int size = hvdc_size();
  if (size < 2) GTEST_SKIP() << "needs a rank that joins while others still submit";
  if (rank < size - 1) {
    Buffer in(HVDC_FLOAT32, 4, [&](int64_t i) { return MoveValue(HVDC_FLOAT32, rank, i); });
    Output out(HVDC_FLOAT32);
    const std::string ag_name = TestName("allgather");
    hvdc_request ag = NewRequest(HVDC_OP_ALLGATHER, ag_name.c_str());
    ag.input = TensorOf(in, {2, 2});
    out.AttachTo(&ag);
    const Result r = RunSync(ag);
    EXPECT_NE(r.code, HVDC_OK) << r;
    EXPECT_TRUE(Contains(r.message, ag_name)) << r;

    const std::string bc_name = TestName("broadcast");
    hvdc_request bc = NewRequest(HVDC_OP_BROADCAST, bc_name.c_str());
    bc.input = TensorOf(in, {4});
    bc.output = bc.input;
    bc.root_rank = 0;
    const Result rb = RunSync(bc);
    EXPECT_NE(rb.code, HVDC_OK) << rb;
    EXPECT_TRUE(Contains(rb.message, bc_name)) << rb;

    std::vector<int> live = Range(size - 1);
    Buffer buf(HVDC_FLOAT64, 5,
               [&](int64_t i) { return ReduceInput(HVDC_FLOAT64, HVDC_SUM, rank, i); });
    const std::string name = TestName("allreduce");
    EXPECT_TRUE(IsOk(RunSync(AllreduceRequest(name.c_str(), buf, buf, {5}, HVDC_SUM))));
    EXPECT_TRUE(BufferMatches(
        buf, [&](int64_t i) { return ReduceExpected(HVDC_FLOAT64, HVDC_SUM, live, i); }));
  }
  int32_t last = -5;
  EXPECT_TRUE(IsOk(Join(&last)));
  EXPECT_GE(last, 0);
  EXPECT_LE(last, size - 2) << "rank size-1 joined first";
  CheckAllgather(
      HVDC_FLOAT32, 0, WorldRanks(), [](int r) { return r + 1; }, {2}, TestName("after"));
}

// ---------------------------------------------------------------------------------------------
// Process sets registered at init: {0,1} and {1,2} (overlapping) at np >= 3, {0} and {1} at np = 2.

std::vector<std::vector<int>> ExpectedInitSets(int size) {
  if (size >= 3) return {{0, 1}, {1, 2}};
  if (size == 2) return {{0}, {1}};
  return {};
}

TEST(ProcessSets, RegisteredAtInit) {
  const int size = hvdc_size();
  const int rank = hvdc_rank();
  const std::vector<SetInfo> sets = ExtraSets();
  const std::vector<std::vector<int>> want = ExpectedInitSets(size);
  ASSERT_EQ(sets.size(), want.size());
  EXPECT_EQ(hvdc_number_of_process_sets(), static_cast<int>(want.size()) + 1);
  for (size_t k = 0; k < sets.size(); ++k) {
    EXPECT_EQ(sets[k].ranks, want[k]) << "set id " << sets[k].id;
    EXPECT_EQ(hvdc_process_set_size(sets[k].id), static_cast<int>(want[k].size()));
    EXPECT_EQ(hvdc_process_set_included(sets[k].id), Member(want[k], rank) ? 1 : 0);
    if (Member(want[k], rank)) {
      EXPECT_EQ(hvdc_process_set_rank(sets[k].id), IndexOf(want[k], rank));
    }
  }
  // Without HOROVOD_DYNAMIC_PROCESS_SETS no set can be added later.
  const int32_t one[] = {0};
  EXPECT_EQ(hvdc_add_process_set(one, 1), HVDC_PROCESS_SET_ERROR_DYNAMIC);
}

// Every member runs each collective on each of its sets (ascending id); the same tensor names are
// used in every set. Rank 1 belongs to both sets at np >= 3.
TEST(ProcessSets, CollectivesWithinSets) {
  const int rank = hvdc_rank();
  for (const SetInfo& set : ExtraSets()) {
    if (!Member(set.ranks, rank)) continue;
    const std::string tag = TestName();  // deliberately the same in every set
    CheckAllgather(
        HVDC_FLOAT32, set.id, set.ranks, [](int r) { return r + 2; }, {3}, tag + ".allgather");
    CheckBroadcastFromEveryRoot(HVDC_INT32, set.id, set.ranks, 17, false, tag + ".broadcast");
    CheckBroadcastFromEveryRoot(HVDC_FLOAT64, set.id, set.ranks, LargeCount(HVDC_FLOAT64), true,
                                tag + ".broadcast_large");
    CheckAlltoall(
        HVDC_FLOAT32, set.id, set.ranks, [](int src, int dst) { return (src + 2 * dst) % 3 + 1; },
        true, {2}, tag + ".alltoall");
    CheckAlltoall(
        HVDC_INT8, set.id, set.ranks, [](int, int) { return 3; }, false, {2},
        tag + ".alltoall_even");
    for (int op : {HVDC_SUM, HVDC_AVERAGE}) {
      CheckReducescatter(HVDC_FLOAT32, op, set.id, set.ranks,
                         3 * static_cast<int64_t>(set.ranks.size()) + 1, {2}, 1.0, 1.0,
                         tag + ".reducescatter_" + ReduceOpName(op));
    }
    CheckBarrierOrders(set.id, set.ranks, tag + ".barrier");
  }
}

}  // namespace
}  // namespace hvdc_test

int main(int argc, char** argv) {
  // The world size is needed before init to register the sets; the launcher says it (mpirun, or
  // HOROVOD_SIZE over the TCP transport).
  int size = 0;
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_SIZE"}) {
    if (const char* v = std::getenv(var)) {
      size = std::atoi(v);
      break;
    }
  }
  std::vector<int32_t> ranks, sizes;
  for (const std::vector<int>& set : hvdc_test::ExpectedInitSets(size)) {
    ranks.insert(ranks.end(), set.begin(), set.end());
    sizes.push_back(static_cast<int32_t>(set.size()));
  }
  hvdc_init_options options = {};
  options.process_set_ranks = ranks.data();
  options.process_set_sizes = sizes.data();
  options.num_process_sets = static_cast<int32_t>(sizes.size());
  return hvdc_test::RunCApiTestMain(argc, argv, &options);
}

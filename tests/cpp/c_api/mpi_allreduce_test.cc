// Allreduce under mpirun, through the C API only: dtype x reduce op x element count x in/out of
// place, scale factors, groups, many tensors in flight in a different order per rank (fusion), and
// overlapping process sets. Inputs are f(rank, index); every expected value is computed here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/c_api.h"
#include "tests/cpp/util/c_api_harness.h"

namespace hvdc_test {
namespace {

// The suites run with HOROVOD_FUSION_THRESHOLD=65536 and HVDC_ZERO_COPY_BYTES=16384: "mid" counts
// are reduced from their own memory but fit the fusion buffer, "large" ones exceed it (and are
// chunked at HVDC_CHUNK_BYTES=8192).
enum class Count { kZero, kOne, kOdd, kMid, kLarge };

int64_t Elements(Count c, int dtype) {
  const int64_t size = static_cast<int64_t>(DtypeSize(dtype));
  switch (c) {
    case Count::kZero:
      return 0;
    case Count::kOne:
      return 1;
    case Count::kOdd:
      return 17;
    case Count::kMid:
      return 24 * 1024 / size + 1;
    case Count::kLarge:
      return 80 * 1024 / size + 3;
  }
  return 0;
}

const char* CountName(Count c) {
  switch (c) {
    case Count::kZero:
      return "n0";
    case Count::kOne:
      return "n1";
    case Count::kOdd:
      return "n17";
    case Count::kMid:
      return "mid";
    case Count::kLarge:
      return "large";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// The matrix

struct AllreduceCase {
  int dtype;
  int op;
  Count count;
  bool in_place;
};

std::vector<AllreduceCase> AllreduceCases() {
  std::vector<AllreduceCase> cases;
  const Count counts[] = {Count::kZero, Count::kOne, Count::kOdd, Count::kMid, Count::kLarge};
  for (int dtype : AllDtypes()) {
    for (int op : {HVDC_SUM, HVDC_AVERAGE, HVDC_MIN, HVDC_MAX, HVDC_PRODUCT}) {
      if (dtype == HVDC_BOOL && op != HVDC_MIN && op != HVDC_MAX) continue;
      for (Count c : counts) {
        for (bool in_place : {false, true}) cases.push_back({dtype, op, c, in_place});
      }
    }
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<AllreduceCase>& info) {
  const AllreduceCase& c = info.param;
  return std::string(DtypeName(c.dtype)) + "_" + ReduceOpName(c.op) + "_" + CountName(c.count) +
         (c.in_place ? "_inplace" : "_outofplace");
}

class AllreduceMatrix : public ::testing::TestWithParam<AllreduceCase> {};

TEST_P(AllreduceMatrix, MatchesClosedForm) {
  const AllreduceCase& c = GetParam();
  const int rank = hvdc_rank();
  const int64_t n = Elements(c.count, c.dtype);
  auto input_fn = [&](int64_t i) { return ReduceInput(c.dtype, c.op, rank, i); };
  Buffer input(c.dtype, n, input_fn);
  Buffer output(c.dtype, n);
  output.Poison();
  Buffer& out = c.in_place ? input : output;
  const std::string name = TestName();
  Result r = RunSync(AllreduceRequest(name.c_str(), input, out, {n}, c.op));
  ASSERT_TRUE(IsOk(r));
  const std::vector<int> ranks = WorldRanks();
  EXPECT_TRUE(BufferMatches(
      out, [&](int64_t i) { return ReduceExpected(c.dtype, c.op, ranks, i); }, "result"));
  if (!c.in_place) {
    EXPECT_TRUE(BufferMatches(input, input_fn, "input (must be unchanged)"));
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypesOpsCounts, AllreduceMatrix, ::testing::ValuesIn(AllreduceCases()),
                         CaseName);

// A 0-dimensional tensor (one element, no dims) and a 3-D one.
TEST(Allreduce, ScalarAndMultiDimensional) {
  const int rank = hvdc_rank();
  const std::vector<int> ranks = WorldRanks();
  for (int dtype : {HVDC_INT32, HVDC_FLOAT32}) {
    Buffer scalar(dtype, 1, [&](int64_t i) { return ReduceInput(dtype, HVDC_SUM, rank, i); });
    const std::string name = TestName(std::string("scalar_") + DtypeName(dtype));
    ASSERT_TRUE(IsOk(RunSync(AllreduceRequest(name.c_str(), scalar, scalar, {}, HVDC_SUM))));
    EXPECT_TRUE(BufferMatches(
        scalar, [&](int64_t i) { return ReduceExpected(dtype, HVDC_SUM, ranks, i); }));

    const std::vector<int64_t> dims = {3, 5, 7};
    Buffer cube(dtype, NumElements(dims),
                [&](int64_t i) { return ReduceInput(dtype, HVDC_MAX, rank, i); });
    Buffer cube_out(dtype, cube.count());
    const std::string cube_name = TestName(std::string("cube_") + DtypeName(dtype));
    ASSERT_TRUE(IsOk(RunSync(AllreduceRequest(cube_name.c_str(), cube, cube_out, dims, HVDC_MAX))));
    EXPECT_TRUE(BufferMatches(
        cube_out, [&](int64_t i) { return ReduceExpected(dtype, HVDC_MAX, ranks, i); }));
  }
}

// The same name used again after completion (the response-cache path) gives fresh results.
TEST(Allreduce, RepeatedNameUsesCurrentValues) {
  const int rank = hvdc_rank();
  const std::vector<int> ranks = WorldRanks();
  const std::string name = TestName();
  for (int step = 0; step < 6; ++step) {
    Buffer buf(HVDC_FLOAT32, 33,
               [&](int64_t i) { return ReduceInput(HVDC_FLOAT32, HVDC_SUM, rank, i) * step; });
    ASSERT_TRUE(IsOk(RunSync(AllreduceRequest(name.c_str(), buf, buf, {33}, HVDC_SUM))));
    EXPECT_TRUE(BufferMatches(
        buf, [&](int64_t i) { return ReduceExpected(HVDC_FLOAT32, HVDC_SUM, ranks, i) * step; }))
        << "step " << step;
  }
}

// ---------------------------------------------------------------------------------------------
// Scale factors

struct ScaleCase {
  int dtype;
  int op;
  Count count;
  double prescale;
  double postscale;
};

std::vector<ScaleCase> ScaleCases() {
  std::vector<ScaleCase> cases;
  for (Count c : {Count::kOdd, Count::kLarge}) {
    for (int dtype : {HVDC_FLOAT16, HVDC_BFLOAT16, HVDC_FLOAT32, HVDC_FLOAT64}) {
      for (int op : {HVDC_SUM, HVDC_AVERAGE}) {
        cases.push_back({dtype, op, c, 0.5, 3.0});
        cases.push_back({dtype, op, c, 3.0, 0.25});
        cases.push_back({dtype, op, c, 1.0, 2.0});
        cases.push_back({dtype, op, c, 0.25, 1.0});
      }
    }
    // Integers with integer factors: the exact result is representable.
    for (int dtype : {HVDC_INT32, HVDC_INT64}) cases.push_back({dtype, HVDC_SUM, c, 2.0, 3.0});
  }
  return cases;
}

std::string ScaleCaseName(const ::testing::TestParamInfo<ScaleCase>& info) {
  const ScaleCase& c = info.param;
  auto factor = [](double f) {
    std::string s = std::to_string(static_cast<int>(std::lround(f * 100)));
    return s;
  };
  return std::string(DtypeName(c.dtype)) + "_" + ReduceOpName(c.op) + "_" + CountName(c.count) +
         "_pre" + factor(c.prescale) + "_post" + factor(c.postscale);
}

class AllreduceScale : public ::testing::TestWithParam<ScaleCase> {};

TEST_P(AllreduceScale, FactorsApplied) {
  const ScaleCase& c = GetParam();
  const int rank = hvdc_rank();
  const int64_t n = Elements(c.count, c.dtype);
  const std::vector<int> ranks = WorldRanks();
  auto expected = [&](int64_t i) {
    return ReduceExpected(c.dtype, c.op, ranks, i, c.prescale, c.postscale);
  };
  for (bool in_place : {false, true}) {
    Buffer input(c.dtype, n, [&](int64_t i) { return ReduceInput(c.dtype, c.op, rank, i); });
    Buffer output(c.dtype, n);
    Buffer& out = in_place ? input : output;
    const std::string name = TestName(in_place ? "inplace" : "outofplace");
    hvdc_request req = AllreduceRequest(name.c_str(), input, out, {n}, c.op);
    req.prescale_factor = c.prescale;
    req.postscale_factor = c.postscale;
    ASSERT_TRUE(IsOk(RunSync(req)));
    EXPECT_TRUE(BufferMatches(out, expected, in_place ? "in place" : "out of place"));
  }
}

INSTANTIATE_TEST_SUITE_P(Factors, AllreduceScale, ::testing::ValuesIn(ScaleCases()), ScaleCaseName);

// Zero factors are read as 1.
TEST(Allreduce, ZeroFactorsMeanOne) {
  const int rank = hvdc_rank();
  const std::vector<int> ranks = WorldRanks();
  Buffer buf(HVDC_FLOAT32, 9,
             [&](int64_t i) { return ReduceInput(HVDC_FLOAT32, HVDC_SUM, rank, i); });
  const std::string name = TestName();
  hvdc_request req = AllreduceRequest(name.c_str(), buf, buf, {9}, HVDC_SUM);
  req.prescale_factor = 0.0;
  req.postscale_factor = 0.0;
  ASSERT_TRUE(IsOk(RunSync(req)));
  EXPECT_TRUE(BufferMatches(
      buf, [&](int64_t i) { return ReduceExpected(HVDC_FLOAT32, HVDC_SUM, ranks, i); }));
}

// ---------------------------------------------------------------------------------------------
// Groups

// One hvdc_enqueue with several members: one callback, every member reduced.
TEST(Allreduce, GroupedMembersAllReduced) {
  const int rank = hvdc_rank();
  const std::vector<int> ranks = WorldRanks();
  struct Group {
    int dtype;
    int op;
    double prescale, postscale;
  };
  const Group groups[] = {{HVDC_FLOAT32, HVDC_SUM, 1.0, 1.0},
                          {HVDC_FLOAT64, HVDC_AVERAGE, 1.0, 1.0},
                          {HVDC_INT32, HVDC_MAX, 1.0, 1.0},
                          {HVDC_FLOAT16, HVDC_SUM, 0.5, 2.0}};
  const Count counts[] = {Count::kZero, Count::kOne,   Count::kOdd,
                          Count::kMid,  Count::kLarge, Count::kOdd};
  for (const Group& g : groups) {
    std::vector<std::unique_ptr<Buffer>> inputs, outputs;
    std::vector<std::string> names;
    std::vector<hvdc_request> reqs;
    const size_t members = sizeof(counts) / sizeof(counts[0]);
    for (size_t k = 0; k < members; ++k) {
      names.push_back(TestName(std::string(DtypeName(g.dtype)) + "_" + std::to_string(k + 1) +
                               "of" + std::to_string(members)));
    }
    for (size_t k = 0; k < members; ++k) {
      const int64_t n = Elements(counts[k], g.dtype);
      inputs.push_back(std::make_unique<Buffer>(
          g.dtype, n, [&](int64_t i) { return ReduceInput(g.dtype, g.op, rank, i + 3 * k); }));
      outputs.push_back(std::make_unique<Buffer>(g.dtype, n));
      const bool in_place = k % 2 == 1;
      hvdc_request req = AllreduceRequest(names[k].c_str(), *inputs[k],
                                          in_place ? *inputs[k] : *outputs[k], {n}, g.op);
      req.prescale_factor = g.prescale;
      req.postscale_factor = g.postscale;
      reqs.push_back(req);
    }
    Result r = RunGroup(reqs);
    ASSERT_TRUE(IsOk(r)) << DtypeName(g.dtype);
    for (size_t k = 0; k < members; ++k) {
      const Buffer& out = k % 2 == 1 ? *inputs[k] : *outputs[k];
      EXPECT_TRUE(BufferMatches(
          out,
          [&](int64_t i) {
            return ReduceExpected(g.dtype, g.op, ranks, i + 3 * k, g.prescale, g.postscale);
          },
          names[k]));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Many tensors at once, issued in a different order on every rank

TEST(Allreduce, ManyTensorsDifferentOrderPerRank) {
  const int rank = hvdc_rank();
  const std::vector<int> ranks = WorldRanks();
  const int dtypes[] = {HVDC_FLOAT32, HVDC_INT32,    HVDC_FLOAT16, HVDC_FLOAT64,
                        HVDC_UINT8,   HVDC_BFLOAT16, HVDC_INT64};
  const int ops[] = {HVDC_SUM, HVDC_MAX, HVDC_AVERAGE, HVDC_MIN, HVDC_PRODUCT};
  const int64_t sizes[] = {1, 17, 300, 4000, 0, 65};
  constexpr int kTensors = 60;
  struct Item {
    int dtype, op;
    int64_t n;
    bool in_place;
    std::unique_ptr<Buffer> input, output;
    std::string name;
  };
  for (int iteration = 0; iteration < 3; ++iteration) {
    std::vector<Item> items(kTensors);
    for (int t = 0; t < kTensors; ++t) {
      Item& it = items[t];
      it.dtype = dtypes[t % 7];
      it.op = ops[t % 5];
      it.n = sizes[t % 6];
      if (t == 11 || t == 42) it.n = Elements(Count::kLarge, it.dtype);
      it.in_place = t % 3 == 0;
      it.input = std::make_unique<Buffer>(it.dtype, it.n, [&](int64_t i) {
        return ReduceInput(it.dtype, it.op, rank, i + t + iteration);
      });
      it.output = std::make_unique<Buffer>(it.dtype, it.n);
      it.name = TestName("t" + std::to_string(t));  // reused across iterations
    }
    std::vector<int> order = Range(kTensors);
    std::mt19937 rng(static_cast<unsigned>(1000 * iteration + rank + 1));
    std::shuffle(order.begin(), order.end(), rng);
    Batch batch;
    for (int t : order) {
      Item& it = items[t];
      batch.Add(AllreduceRequest(it.name.c_str(), *it.input, it.in_place ? *it.input : *it.output,
                                 {it.n}, it.op));
    }
    std::vector<Result> results = batch.WaitAll();
    for (size_t k = 0; k < order.size(); ++k) {
      const int t = order[k];
      Item& it = items[t];
      EXPECT_TRUE(IsOk(results[k])) << it.name;
      const Buffer& out = it.in_place ? *it.input : *it.output;
      EXPECT_TRUE(BufferMatches(
          out, [&](int64_t i) { return ReduceExpected(it.dtype, it.op, ranks, i + t + iteration); },
          it.name + " (" + DtypeName(it.dtype) + " " + ReduceOpName(it.op) + ", iteration " +
              std::to_string(iteration) + ")"));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Process sets (HOROVOD_DYNAMIC_PROCESS_SETS=1 is exported by main)

// Sets A and B overlap at np >= 3 ({0,1} and {1,2}); at np = 2 they are {0} and {1}, because
// {0,1} would duplicate the global set.
TEST(ProcessSets, ConcurrentAllreducesOnOverlappingSets) {
  const int size = hvdc_size();
  const int rank = hvdc_rank();
  if (size < 2) GTEST_SKIP() << "needs two ranks for two sets";
  if (size == 2) {
    const int32_t both[] = {0, 1};
    EXPECT_EQ(hvdc_add_process_set(both, 2), HVDC_PROCESS_SET_ERROR_EXISTING_SET)
        << "a set equal to the global set must be rejected";
  }
  const std::vector<int32_t> a = size >= 3 ? std::vector<int32_t>{0, 1} : std::vector<int32_t>{0};
  const std::vector<int32_t> b = size >= 3 ? std::vector<int32_t>{1, 2} : std::vector<int32_t>{1};
  const int id_a = hvdc_add_process_set(a.data(), static_cast<int32_t>(a.size()));
  const int id_b = hvdc_add_process_set(b.data(), static_cast<int32_t>(b.size()));
  ASSERT_GT(id_a, 0) << hvdc_last_error();
  ASSERT_GT(id_b, 0) << hvdc_last_error();
  EXPECT_NE(id_a, id_b);
  EXPECT_EQ(hvdc_number_of_process_sets(), 3);
  EXPECT_EQ(hvdc_add_process_set(a.data(), static_cast<int32_t>(a.size())),
            HVDC_PROCESS_SET_ERROR_EXISTING_SET);

  std::vector<int32_t> ids(8, -1);
  const int num_ids = hvdc_process_set_ids(ids.data(), 8);
  ASSERT_EQ(num_ids, 3);
  std::vector<int32_t> sorted_ids(ids.begin(), ids.begin() + 3);
  std::sort(sorted_ids.begin(), sorted_ids.end());
  std::vector<int32_t> want_ids = {0, id_a, id_b};
  std::sort(want_ids.begin(), want_ids.end());
  EXPECT_EQ(sorted_ids, want_ids);

  struct Set {
    int id;
    std::vector<int> ranks;
  };
  const std::vector<Set> sets = {{0, WorldRanks()},
                                 {id_a, std::vector<int>(a.begin(), a.end())},
                                 {id_b, std::vector<int>(b.begin(), b.end())}};
  for (const Set& s : sets) {
    EXPECT_EQ(SetRanks(s.id), s.ranks) << "set " << s.id;
    EXPECT_EQ(hvdc_process_set_size(s.id), static_cast<int>(s.ranks.size()));
    const bool member = Member(s.ranks, rank);
    EXPECT_EQ(hvdc_process_set_included(s.id), member ? 1 : 0) << "set " << s.id;
    if (member) {
      const int want =
          static_cast<int>(std::find(s.ranks.begin(), s.ranks.end(), rank) - s.ranks.begin());
      EXPECT_EQ(hvdc_process_set_rank(s.id), want) << "set " << s.id;
    } else {
      EXPECT_EQ(hvdc_process_set_rank(s.id), HVDC_PROCESS_SET_ERROR_FOREIGN_SET) << "set " << s.id;
    }
  }

  // Every member issues, all at once and in a rank-dependent order, several allreduces on each of
  // its sets; the tensor names are the same in every set (a key is (set, name)).
  struct Item {
    const Set* set;
    int op;
    int dtype;
    int64_t n;
    std::unique_ptr<Buffer> buf;
    std::string name;
  };
  for (int iteration = 0; iteration < 2; ++iteration) {
    std::vector<Item> items;
    for (const Set& s : sets) {
      if (!Member(s.ranks, rank)) continue;
      int k = 0;
      for (int op : {HVDC_SUM, HVDC_AVERAGE, HVDC_MAX}) {
        for (Count c : {Count::kOdd, Count::kLarge}) {
          Item it;
          it.set = &s;
          it.op = op;
          it.dtype = k % 2 ? HVDC_FLOAT64 : HVDC_FLOAT32;
          it.n = Elements(c, it.dtype);
          it.name = TestName("x" + std::to_string(k++));
          items.push_back(std::move(it));
        }
      }
    }
    for (Item& it : items) {
      it.buf = std::make_unique<Buffer>(it.dtype, it.n, [&](int64_t i) {
        return ReduceInput(it.dtype, it.op, rank, i + it.set->id + iteration);
      });
    }
    std::vector<int> order = Range(static_cast<int>(items.size()));
    std::mt19937 rng(static_cast<unsigned>(77 * rank + iteration));
    std::shuffle(order.begin(), order.end(), rng);
    Batch batch;
    for (int t : order) {
      Item& it = items[t];
      batch.Add(AllreduceRequest(it.name.c_str(), *it.buf, *it.buf, {it.n}, it.op, it.set->id));
    }
    std::vector<Result> results = batch.WaitAll();
    for (size_t k = 0; k < order.size(); ++k) {
      const Item& it = items[order[k]];
      EXPECT_TRUE(IsOk(results[k])) << it.name << " in set " << it.set->id;
      EXPECT_TRUE(BufferMatches(
          *it.buf,
          [&](int64_t i) {
            return ReduceExpected(it.dtype, it.op, it.set->ranks, i + it.set->id + iteration);
          },
          it.name + " in set " + std::to_string(it.set->id) + " (" + ReduceOpName(it.op) + ")"));
    }
  }

  EXPECT_EQ(hvdc_remove_process_set(id_a), 0) << hvdc_last_error();
  EXPECT_EQ(hvdc_remove_process_set(id_b), 0) << hvdc_last_error();
  EXPECT_EQ(hvdc_number_of_process_sets(), 1);
  EXPECT_EQ(hvdc_process_set_size(id_a), HVDC_PROCESS_SET_ERROR_UNKNOWN_SET);
  EXPECT_LT(hvdc_remove_process_set(id_a), 0) << "removing twice";
  EXPECT_LT(hvdc_remove_process_set(0), 0) << "the global set cannot be removed";

  // A freed id is handed out again.
  const int id_c = hvdc_add_process_set(b.data(), static_cast<int32_t>(b.size()));
  EXPECT_TRUE(id_c == id_a || id_c == id_b)
      << "got id " << id_c << ", freed " << id_a << " and " << id_b;
  if (id_c > 0) {
    if (Member(std::vector<int>(b.begin(), b.end()), rank)) {
      Buffer buf(HVDC_FLOAT32, 5,
                 [&](int64_t i) { return ReduceInput(HVDC_FLOAT32, HVDC_SUM, rank, i); });
      const std::string name = TestName("after_readd");
      EXPECT_TRUE(IsOk(RunSync(AllreduceRequest(name.c_str(), buf, buf, {5}, HVDC_SUM, id_c))));
      EXPECT_TRUE(BufferMatches(buf, [&](int64_t i) {
        return ReduceExpected(HVDC_FLOAT32, HVDC_SUM, std::vector<int>(b.begin(), b.end()), i);
      }));
    }
    EXPECT_EQ(hvdc_remove_process_set(id_c), 0) << hvdc_last_error();
  }
  EXPECT_EQ(hvdc_number_of_process_sets(), 1);
}

}  // namespace
}  // namespace hvdc_test

int main(int argc, char** argv) {
  setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "1", 1);
  return hvdc_test::RunCApiTestMain(argc, argv);
}

// Lifecycle without a launcher, through the C API only: a plain process (no mpirun, no launcher
// variables) runs as rank 0 of 1 without MPI. Before init everything answers -1 or fails; every
// collective works on one rank; init is idempotent, shutdown then init starts afresh, and invalid
// HOROVOD_* values make init fail with a message naming the variable.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/build_config.h"
#include "core/c_api.h"
#include "tests/cpp/util/c_api_harness.h"

namespace hvdc_test {
namespace {

void EnsureUp() {
  if (hvdc_is_initialized() != 1) {
    ASSERT_EQ(hvdc_init(nullptr), HVDC_OK) << hvdc_last_error();
  }
}

void EnsureDown() {
  if (hvdc_is_initialized() == 1) {
    ASSERT_EQ(hvdc_shutdown(), HVDC_OK) << hvdc_last_error();
  }
}

int64_t LargeCount(int dtype) { return 80 * 1024 / static_cast<int64_t>(DtypeSize(dtype)) + 3; }

void ExpectTopologyDown() {
  EXPECT_EQ(hvdc_is_initialized(), 0);
  EXPECT_EQ(hvdc_rank(), -1);
  EXPECT_EQ(hvdc_size(), -1);
  EXPECT_EQ(hvdc_local_rank(), -1);
  EXPECT_EQ(hvdc_local_size(), -1);
  EXPECT_EQ(hvdc_cross_rank(), -1);
  EXPECT_EQ(hvdc_cross_size(), -1);
  EXPECT_EQ(hvdc_is_homogeneous(), -1);
  EXPECT_EQ(hvdc_mpi_threads_supported(), -1);
  EXPECT_LT(hvdc_process_set_size(0), 0);
  EXPECT_LT(hvdc_process_set_rank(0), 0);
}

// An allreduce on one rank: Sum of one contribution is the input itself.
void ExpectAllreduceWorks(const std::string& tag) {
  Buffer buf(HVDC_FLOAT32, 11, [](int64_t i) { return ReduceInput(HVDC_FLOAT32, HVDC_SUM, 0, i); });
  const std::string name = TestName(tag);
  EXPECT_TRUE(IsOk(RunSync(AllreduceRequest(name.c_str(), buf, buf, {11}, HVDC_SUM))));
  EXPECT_TRUE(
      BufferMatches(buf, [](int64_t i) { return ReduceInput(HVDC_FLOAT32, HVDC_SUM, 0, i); }));
}

// An enqueue while the runtime is down fails in hvdc_enqueue, without a callback.
void ExpectEnqueueRejected(const std::string& tag) {
  Buffer buf(HVDC_FLOAT32, 4);
  const std::string name = TestName(tag);
  Pending p = Enqueue(AllreduceRequest(name.c_str(), buf, buf, {4}, HVDC_SUM));
  EXPECT_TRUE(p.enqueue_failed()) << "hvdc_enqueue must fail while the runtime is down";
  Result r;
  if (p.enqueue_failed() && p.WaitFor(std::chrono::milliseconds(0), &r)) {
    EXPECT_NE(r.code, HVDC_OK);
    EXPECT_FALSE(r.message.empty()) << "hvdc_last_error() explains";
  }
}

// ---------------------------------------------------------------------------------------------

TEST(Init, EverythingFailsBeforeInit) {
  ExpectTopologyDown();
  ExpectEnqueueRejected("before_init");
  // Build-time facts need no runtime.
  EXPECT_EQ(hvdc_mpi_built(), HVDC_HAVE_MPI);  // 0 in HVDC_WITH_MPI=OFF builds
  EXPECT_EQ(hvdc_cuda_built(), HVDC_HAVE_NCCL);
  EXPECT_EQ(hvdc_nccl_built(), HVDC_NCCL_VERSION_CODE);
  ASSERT_NE(hvdc_version(), nullptr);
  EXPECT_STRNE(hvdc_version(), "");
}

TEST(Init, RankZeroOfOneWithoutLauncher) {
  ASSERT_EQ(hvdc_init(nullptr), HVDC_OK) << hvdc_last_error();
  EXPECT_EQ(hvdc_is_initialized(), 1);
  EXPECT_EQ(hvdc_rank(), 0);
  EXPECT_EQ(hvdc_size(), 1);
  EXPECT_EQ(hvdc_local_rank(), 0);
  EXPECT_EQ(hvdc_local_size(), 1);
  EXPECT_EQ(hvdc_cross_rank(), 0);
  EXPECT_EQ(hvdc_cross_size(), 1);
  EXPECT_EQ(hvdc_is_homogeneous(), 1);
  EXPECT_EQ(hvdc_mpi_enabled(), 0) << "no launcher: MPI is not used";
  EXPECT_EQ(hvdc_mpi_threads_supported(), -1) << "-1 when MPI is unused";
  EXPECT_EQ(hvdc_number_of_process_sets(), 1);
  EXPECT_EQ(hvdc_process_set_size(0), 1);
  EXPECT_EQ(hvdc_process_set_rank(0), 0);
  EXPECT_EQ(hvdc_process_set_included(0), 1);
  EXPECT_EQ(SetRanks(0), std::vector<int>{0});
  const int32_t zero[] = {0};
  // Not dynamic (and {0} is the global set anyway).
  const int added = hvdc_add_process_set(zero, 1);
  EXPECT_TRUE(added == HVDC_PROCESS_SET_ERROR_DYNAMIC ||
              added == HVDC_PROCESS_SET_ERROR_EXISTING_SET)
      << added;
}

// ---------------------------------------------------------------------------------------------
// Every collective on one rank

TEST(SingleRank, AllreduceEveryDtypeOpAndCount) {
  EnsureUp();
  const std::vector<int> me = {0};
  for (int dtype : AllDtypes()) {
    for (int op : {HVDC_SUM, HVDC_AVERAGE, HVDC_MIN, HVDC_MAX, HVDC_PRODUCT}) {
      if (dtype == HVDC_BOOL && op != HVDC_MIN && op != HVDC_MAX) continue;
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, LargeCount(dtype)}) {
        for (bool in_place : {false, true}) {
          auto input = [&](int64_t i) { return ReduceInput(dtype, op, 0, i); };
          Buffer in(dtype, n, input);
          Buffer out(dtype, n);
          out.Poison();
          Buffer& dst = in_place ? in : out;
          const std::string what = std::string(DtypeName(dtype)) + "_" + ReduceOpName(op) + "_" +
                                   std::to_string(n) + (in_place ? "_inplace" : "");
          const std::string name = TestName(what);
          hvdc_request req = AllreduceRequest(name.c_str(), in, dst, {n}, op);
          const bool scaled = IsFloat(dtype) && n == 17;
          if (scaled) {
            req.prescale_factor = 0.5;
            req.postscale_factor = 4.0;
          }
          EXPECT_TRUE(IsOk(RunSync(req))) << what;
          EXPECT_TRUE(BufferMatches(
              dst,
              [&](int64_t i) {
                return ReduceExpected(dtype, op, me, i, scaled ? 0.5 : 1.0, scaled ? 4.0 : 1.0);
              },
              what));
        }
      }
    }
  }
}

TEST(SingleRank, GroupedAllreduce) {
  EnsureUp();
  std::vector<std::unique_ptr<Buffer>> bufs;
  std::vector<std::string> names;
  std::vector<hvdc_request> reqs;
  const int64_t counts[] = {3, 0, 17, LargeCount(HVDC_FLOAT64)};
  for (int k = 0; k < 4; ++k) names.push_back(TestName(std::to_string(k + 1) + "of4"));
  for (int k = 0; k < 4; ++k) {
    bufs.push_back(std::make_unique<Buffer>(HVDC_FLOAT64, counts[k], [&](int64_t i) {
      return ReduceInput(HVDC_FLOAT64, HVDC_AVERAGE, 0, i + k);
    }));
    reqs.push_back(
        AllreduceRequest(names[k].c_str(), *bufs[k], *bufs[k], {counts[k]}, HVDC_AVERAGE));
  }
  ASSERT_TRUE(IsOk(RunGroup(reqs)));
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(BufferMatches(
        *bufs[k], [&](int64_t i) { return ReduceInput(HVDC_FLOAT64, HVDC_AVERAGE, 0, i + k); },
        names[k]));
  }
}

TEST(SingleRank, AllgatherReturnsTheInput) {
  EnsureUp();
  for (int dtype : AllDtypes()) {
    for (int64_t rows : {int64_t{0}, int64_t{3}}) {
      auto input = [&](int64_t i) { return MoveValue(dtype, 0, i); };
      Buffer in(dtype, rows * 2, input);
      Output out(dtype);
      const std::string name = TestName(std::string(DtypeName(dtype)) + std::to_string(rows));
      hvdc_request req = NewRequest(HVDC_OP_ALLGATHER, name.c_str());
      req.input = TensorOf(in, {rows, 2});
      out.AttachTo(&req);
      EXPECT_TRUE(IsOk(RunSync(req))) << name;
      EXPECT_EQ(out.calls(), 1);
      EXPECT_EQ(out.dims(), (std::vector<int64_t>{rows, 2})) << name;
      EXPECT_TRUE(BufferMatches(out.buffer(), input, name));
    }
  }
}

TEST(SingleRank, BroadcastFromRankZero) {
  EnsureUp();
  for (int dtype : AllDtypes()) {
    for (bool in_place : {false, true}) {
      auto input = [&](int64_t i) { return MoveValue(dtype, 0, i); };
      Buffer in(dtype, 17, input);
      Buffer out(dtype, 17);
      out.Poison();
      Buffer& dst = in_place ? in : out;
      const std::string name =
          TestName(std::string(DtypeName(dtype)) + (in_place ? "_inplace" : ""));
      hvdc_request req = NewRequest(HVDC_OP_BROADCAST, name.c_str());
      req.input = TensorOf(in, {17});
      req.output = TensorOf(dst, {17});
      req.root_rank = 0;
      EXPECT_TRUE(IsOk(RunSync(req))) << name;
      EXPECT_TRUE(BufferMatches(dst, input, name));
    }
  }
  // Root 1 does not exist.
  Buffer buf(HVDC_FLOAT32, 3);
  const std::string name = TestName("bad_root");
  hvdc_request req = NewRequest(HVDC_OP_BROADCAST, name.c_str());
  req.input = TensorOf(buf, {3});
  req.output = req.input;
  req.root_rank = 1;
  const Result r = RunSync(req);
  EXPECT_TRUE(r.code == HVDC_INVALID_ARGUMENT || r.code == HVDC_PRECONDITION_ERROR) << r;
  ExpectAllreduceWorks("after_bad_root");
}

TEST(SingleRank, AlltoallKeepsEverything) {
  EnsureUp();
  for (int dtype : AllDtypes()) {
    for (bool explicit_splits : {true, false}) {
      const int64_t rows = 5;
      auto input = [&](int64_t i) { return MoveValue(dtype, 0, i); };
      Buffer in(dtype, rows * 3, input);
      Output out(dtype);
      const int32_t splits[] = {static_cast<int32_t>(rows)};
      int32_t received[1] = {-1};
      const std::string name =
          TestName(std::string(DtypeName(dtype)) + (explicit_splits ? "_splits" : "_even"));
      hvdc_request req = NewRequest(HVDC_OP_ALLTOALL, name.c_str());
      req.input = TensorOf(in, {rows, 3});
      if (explicit_splits) {
        req.splits = splits;
        req.num_splits = 1;
      }
      req.received_splits = received;
      out.AttachTo(&req);
      EXPECT_TRUE(IsOk(RunSync(req))) << name;
      EXPECT_EQ(received[0], rows) << name;
      EXPECT_EQ(out.dims(), (std::vector<int64_t>{rows, 3})) << name;
      EXPECT_TRUE(BufferMatches(out.buffer(), input, name));
    }
  }
}

TEST(SingleRank, ReducescatterKeepsAllRows) {
  EnsureUp();
  for (int dtype : {HVDC_INT32, HVDC_INT64, HVDC_FLOAT16, HVDC_FLOAT32, HVDC_FLOAT64}) {
    for (int op : {HVDC_SUM, HVDC_AVERAGE}) {
      auto input = [&](int64_t i) { return ReduceInput(dtype, op, 0, i); };
      Buffer in(dtype, 5 * 2, input);
      Output out(dtype);
      const std::string name = TestName(std::string(DtypeName(dtype)) + "_" + ReduceOpName(op));
      hvdc_request req = NewRequest(HVDC_OP_REDUCESCATTER, name.c_str());
      req.input = TensorOf(in, {5, 2});
      req.reduce_op = op;
      out.AttachTo(&req);
      EXPECT_TRUE(IsOk(RunSync(req))) << name;
      EXPECT_EQ(out.dims(), (std::vector<int64_t>{5, 2})) << name;
      EXPECT_TRUE(BufferMatches(out.buffer(), input, name));
    }
  }
  // Only Sum and Average scatter.
  Buffer in(HVDC_FLOAT32, 4);
  Output out(HVDC_FLOAT32);
  const std::string name = TestName("max");
  hvdc_request req = NewRequest(HVDC_OP_REDUCESCATTER, name.c_str());
  req.input = TensorOf(in, {4});
  req.reduce_op = HVDC_MAX;
  out.AttachTo(&req);
  EXPECT_TRUE(IsError(RunSync(req), HVDC_ABORTED, {name}));
  ExpectAllreduceWorks("after_max");
}

TEST(SingleRank, BarrierAndJoin) {
  EnsureUp();
  const std::string name = TestName("barrier");
  EXPECT_TRUE(IsOk(RunSync(NewRequest(HVDC_OP_BARRIER, name.c_str()))));
  int32_t last = -5;
  hvdc_request join = NewRequest(HVDC_OP_JOIN, "join.noname");
  join.join_last_rank = &last;
  EXPECT_TRUE(IsOk(RunSync(join)));
  EXPECT_EQ(last, 0);
  ExpectAllreduceWorks("after_join");
}

// ready_event/done_stream order CUDA streams; on a host tensor they are a caller's mistake.
TEST(SingleRank, CudaStreamFieldsRejectedForHostTensors) {
  EnsureUp();
  Buffer buf(HVDC_FLOAT32, 4);
  int dummy = 0;
  for (int field = 0; field < 2; ++field) {
    const std::string name = TestName(field == 0 ? "ready_event_on_host" : "done_stream_on_host");
    hvdc_request req = NewRequest(HVDC_OP_ALLREDUCE, name.c_str());
    req.input = TensorOf(buf, {4});
    req.output = req.input;
    req.reduce_op = HVDC_SUM;
    if (field == 0) req.ready_event = &dummy;
    if (field == 1) req.done_stream = &dummy;
    const Result r = RunSync(req);
    EXPECT_TRUE(r.from_enqueue) << r;
    EXPECT_EQ(r.code, HVDC_INVALID_ARGUMENT) << r;
    EXPECT_NE(r.message.find("CUDA tensors"), std::string::npos) << r;
  }
  ExpectAllreduceWorks("after_stream_fields");
}

TEST(SingleRank, ManyInFlight) {
  EnsureUp();
  Batch batch;
  std::vector<std::unique_ptr<Buffer>> bufs;
  for (int t = 0; t < 50; ++t) {
    const int dtype = t % 2 ? HVDC_FLOAT32 : HVDC_INT32;
    bufs.push_back(std::make_unique<Buffer>(
        dtype, t % 7 + 1, [&](int64_t i) { return ReduceInput(dtype, HVDC_SUM, 0, i + t); }));
    const char* name = batch.Name(TestName("t" + std::to_string(t)));
    batch.Add(AllreduceRequest(name, *bufs.back(), *bufs.back(), {t % 7 + 1}, HVDC_SUM));
  }
  const std::vector<Result> results = batch.WaitAll();
  for (int t = 0; t < 50; ++t) {
    EXPECT_TRUE(IsOk(results[t])) << t;
    const int dtype = bufs[t]->dtype();
    EXPECT_TRUE(
        BufferMatches(*bufs[t], [&](int64_t i) { return ReduceInput(dtype, HVDC_SUM, 0, i + t); }));
  }
}

// ---------------------------------------------------------------------------------------------
// Lifecycle

TEST(Lifecycle, InitTwiceIsHarmless) {
  EnsureUp();
  EXPECT_EQ(hvdc_init(nullptr), HVDC_OK) << hvdc_last_error();
  EXPECT_EQ(hvdc_is_initialized(), 1);
  EXPECT_EQ(hvdc_size(), 1);
  ExpectAllreduceWorks("after_second_init");
}

TEST(Lifecycle, ShutdownThenInitAgain) {
  for (int round = 0; round < 3; ++round) {
    EnsureUp();
    ExpectAllreduceWorks("round" + std::to_string(round));
    ASSERT_EQ(hvdc_shutdown(), HVDC_OK) << hvdc_last_error();
    ExpectTopologyDown();
    ExpectEnqueueRejected("down" + std::to_string(round));
    ASSERT_EQ(hvdc_init(nullptr), HVDC_OK) << hvdc_last_error();
    EXPECT_EQ(hvdc_rank(), 0);
    EXPECT_EQ(hvdc_size(), 1);
    ExpectAllreduceWorks("again" + std::to_string(round));
  }
}

TEST(Lifecycle, ShutdownTwiceIsHarmless) {
  EnsureUp();
  EXPECT_EQ(hvdc_shutdown(), HVDC_OK) << hvdc_last_error();
  hvdc_shutdown();  // whatever it returns, it must not crash or hang
  ExpectTopologyDown();
  EnsureUp();
  ExpectAllreduceWorks("after");
}

// ---------------------------------------------------------------------------------------------
// Configuration

TEST(Config, InvalidValuesFailInit) {
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"HOROVOD_FUSION_THRESHOLD", "abc"},
      {"HOROVOD_FUSION_THRESHOLD", "-5"},
      {"HOROVOD_CYCLE_TIME", "-1"},
      {"HOROVOD_CYCLE_TIME", "fast"},
      {"HOROVOD_CACHE_CAPACITY", "lots"},
      {"HOROVOD_STALL_CHECK_TIME_SECONDS", "soon"},
      {"HOROVOD_CONTROLLER", "carrier_pigeon"},
      {"HOROVOD_CPU_OPERATIONS", "abacus"},
      {"HOROVOD_LOG_LEVEL", "loud"},
      {"HVDC_CHUNK_BYTES", "big"},
      {"HVDC_ZERO_COPY_BYTES", "huge"},
  };
  for (const auto& [var, value] : bad) {
    EnsureDown();
    setenv(var, value, 1);
    const int rc = hvdc_init(nullptr);
    const std::string message = hvdc_last_error() ? hvdc_last_error() : "";
    unsetenv(var);
    EXPECT_NE(rc, HVDC_OK) << var << "=" << value << " was accepted";
    if (rc == HVDC_OK) continue;
    EXPECT_TRUE(Contains(message, var)) << var << "=" << value << ": \"" << message << "\"";
    EXPECT_TRUE(Contains(message, value)) << var << "=" << value << ": \"" << message << "\"";
    ExpectTopologyDown();
  }
  // With the variables gone, init works again.
  EnsureDown();
  ASSERT_EQ(hvdc_init(nullptr), HVDC_OK) << hvdc_last_error();
  ExpectAllreduceWorks("after");
}

TEST(Config, ValidValuesAccepted) {
  const std::vector<std::pair<const char*, const char*>> good = {
      {"HOROVOD_FUSION_THRESHOLD", "0"},                                   // fusion off
      {"HOROVOD_CYCLE_TIME", "0.5"},     {"HOROVOD_CACHE_CAPACITY", "0"},  // cache off
      {"HOROVOD_LOG_LEVEL", "ERROR"},                                      // case-insensitive
      {"HOROVOD_CONTROLLER", "MPI"},
  };
  for (const auto& [var, value] : good) {
    EnsureDown();
    setenv(var, value, 1);
    const int rc = hvdc_init(nullptr);
    unsetenv(var);
    EXPECT_EQ(rc, HVDC_OK) << var << "=" << value << ": " << hvdc_last_error();
    if (rc == HVDC_OK) ExpectAllreduceWorks(std::string(var) + "_" + value);
  }
  EnsureDown();
}

}  // namespace
}  // namespace hvdc_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int result = RUN_ALL_TESTS();
  if (hvdc_is_initialized() == 1) hvdc_shutdown();
  const hvdc_test::LedgerReport report = hvdc_test::CheckLedger();
  for (const std::string& p : report.problems)
    std::fprintf(stderr, "callback ledger: %s\n", p.c_str());
  if (!report.clean()) result = 1;
  return result;
}

// init() -> shutdown() -> init() in one process through the C API, as elastic training does it:
// under mpirun (the runtime initialises MPI itself on the first init and finalises it only at
// process exit, so every later init finds it ready) and over the TCP transport (tcp_launch.py; the
// same ports every cycle). Each cycle's collectives are checked against closed forms; an operation
// pending at shutdown fails exactly once; process sets added in one cycle are gone in the next.
// After the tests the runtime is initialised once more and main() returns without shutdown(): the
// exit hook stops it before MPI is finalised (mpirun reports a non-zero status otherwise).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/cpp/util/c_api_harness.h"

namespace {

using hvdc_test::Buffer;
using hvdc_test::Result;

constexpr int kCycles = 3;

// Rank r's element i in cycle c, exact in float64.
double Value(int c, int r, int64_t i) { return 1000.0 * c + 10.0 * r + static_cast<double>(i % 9); }

void Init() {
  ASSERT_EQ(hvdc_init(nullptr), HVDC_OK) << hvdc_last_error();
  ASSERT_EQ(hvdc_is_initialized(), 1);
}

void Shutdown() {
  ASSERT_EQ(hvdc_shutdown(), HVDC_OK) << hvdc_last_error();
  EXPECT_EQ(hvdc_is_initialized(), 0);
  EXPECT_EQ(hvdc_rank(), -1);
}

// Allreduce (sum) of a few sizes, small to above the fusion threshold, and a broadcast from the
// last rank, all in flight together.
void CheckCollectives(int cycle) {
  const int n = hvdc_size(), me = hvdc_rank();
  const std::vector<int64_t> counts = {1, 33, 20000};
  std::vector<Buffer> in, out, bc;
  for (int64_t count : counts) {
    in.emplace_back(HVDC_FLOAT64, count);
    out.emplace_back(HVDC_FLOAT64, count);
    bc.emplace_back(HVDC_FLOAT64, count);
    for (int64_t i = 0; i < count; ++i) {
      in.back().Set(i, Value(cycle, me, i));
      bc.back().Set(i, me == n - 1 ? Value(cycle, me, i) : -1.0);
    }
  }
  std::vector<std::string> names;
  for (int64_t count : counts) {
    names.push_back("cycle" + std::to_string(cycle) + ".sum." + std::to_string(count));
    names.push_back("cycle" + std::to_string(cycle) + ".bc." + std::to_string(count));
  }
  std::vector<hvdc_test::Pending> pending;
  for (size_t k = 0; k < counts.size(); ++k) {
    pending.push_back(hvdc_test::Enqueue(
        hvdc_test::AllreduceRequest(names[2 * k].c_str(), in[k], out[k], {counts[k]}, HVDC_SUM)));
    hvdc_request b = hvdc_test::NewRequest(HVDC_OP_BROADCAST, names[2 * k + 1].c_str());
    b.input = hvdc_test::TensorOf(bc[k], {counts[k]});
    b.output = b.input;
    b.root_rank = n - 1;
    pending.push_back(hvdc_test::Enqueue(b));
  }
  for (auto& p : pending) ASSERT_TRUE(hvdc_test::IsOk(p.Wait()));
  for (size_t k = 0; k < counts.size(); ++k) {
    EXPECT_TRUE(hvdc_test::BufferMatches(out[k], [&](int64_t i) {
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += Value(cycle, r, i);
      return sum;
    }));
    EXPECT_TRUE(hvdc_test::BufferMatches(bc[k], [&](int64_t i) { return Value(cycle, n - 1, i); }));
  }
}

TEST(Reinit, CyclesComputeCorrectResults) {
  int size = -1, rank = -1;
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    Init();
    if (cycle == 0) {
      size = hvdc_size();
      rank = hvdc_rank();
    }
    EXPECT_EQ(hvdc_size(), size);
    EXPECT_EQ(hvdc_rank(), rank);
    CheckCollectives(cycle);
    Shutdown();
    // Between cycles, operations fail as before any init.
    Buffer x(HVDC_FLOAT64, 1);
    hvdc_request r = hvdc_test::AllreduceRequest("between", x, x, {1}, HVDC_SUM);
    EXPECT_TRUE(hvdc_test::IsError(hvdc_test::RunSync(r), HVDC_PRECONDITION_ERROR,
                                   {"not been initialized"}));
  }
}

// Rank 0 submits a tensor nobody else does; every rank shuts down. Rank 0's callback fails once
// with the shut-down error, and the next runtime runs a tensor of the same name.
TEST(Reinit, PendingAtShutdownFailsOnce) {
  Init();
  const int me = hvdc_rank();
  Buffer x(HVDC_FLOAT64, 1), y(HVDC_FLOAT64, 1);
  x.Set(0, 1.0);
  hvdc_test::Pending lonely;
  if (me == 0) {
    lonely = hvdc_test::Enqueue(hvdc_test::AllreduceRequest("lonely", x, y, {1}, HVDC_SUM));
    ASSERT_FALSE(lonely.enqueue_failed());
  }
  Shutdown();
  if (me == 0) {
    EXPECT_TRUE(hvdc_test::IsError(lonely.Wait(), HVDC_UNKNOWN_ERROR, {"shut down"}));
  }
  Init();
  const int n = hvdc_size();
  x.Set(0, hvdc_rank() + 1.0);
  EXPECT_TRUE(hvdc_test::IsOk(
      hvdc_test::RunSync(hvdc_test::AllreduceRequest("lonely", x, y, {1}, HVDC_SUM))));
  EXPECT_EQ(y.Get(0), n * (n + 1) / 2.0);
  Shutdown();
}

// A process set added in one cycle does not survive into the next (Horovod: dynamic sets are
// re-added by the program after a reset).
TEST(Reinit, ProcessSetsStartAfreshEachCycle) {
  Init();
  const int n = hvdc_size();
  std::vector<int32_t> first = {0, n - 1};
  if (n == 2) first = {0};
  const int id = hvdc_add_process_set(first.data(), static_cast<int32_t>(first.size()));
  ASSERT_GT(id, 0) << hvdc_last_error();
  EXPECT_EQ(hvdc_number_of_process_sets(), 2);
  Shutdown();
  Init();
  EXPECT_EQ(hvdc_number_of_process_sets(), 1);
  EXPECT_LT(hvdc_process_set_size(id), 0);
  const int again = hvdc_add_process_set(first.data(), static_cast<int32_t>(first.size()));
  EXPECT_EQ(again, id) << hvdc_last_error();
  Shutdown();
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "1", 1);
  setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "30", 0);
  setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "60", 0);
  int result = RUN_ALL_TESTS();
  const hvdc_test::LedgerReport report = hvdc_test::CheckLedger();
  for (const std::string& p : report.problems)
    std::fprintf(stderr, "callback ledger: %s\n", p.c_str());
  if (!report.clean()) result = 1;
  // Left running: the exit hook shuts it down before MPI is finalised.
  if (hvdc_init(nullptr) != HVDC_OK) {
    std::fprintf(stderr, "final init failed: %s\n", hvdc_last_error());
    return 1;
  }
  return result;
}

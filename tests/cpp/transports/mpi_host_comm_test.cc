// What only the MPI data plane has, under mpirun (np 2 and 3); the HostComm contract itself is
// checked by the conformance suites (conformance/mpi_conformance_test.cc). Here: a small per-call
// limit so the chunked Allreduce and Broadcast paths run, two comms used from two threads at
// once, counts and offsets MPI cannot take (INT_MAX), an MPI error turned into a Status, and the
// factory's null communicator.
//
// Every rank runs every test; collectives are never skipped after a failed check (EXPECT, not
// ASSERT, around them) so a failure cannot turn into a hang. Rank 0 prints gtest's output, other
// ranks print only their failures, and the exit code is non-zero on every rank if any failed.
#include "mpi_controller/mpi_host_comm.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/types.h"
#include "tests/cpp/conformance/host_comm_checks.h"
#include "tests/cpp/conformance/suite_util.h"
#include "tests/cpp/conformance/values.h"
#include "tests/cpp/util/rank_failure_printer.h"

namespace hvdc {
namespace {

using conformance::CheckAllreduce;
using conformance::CheckBroadcast;
using conformance::Range;

int g_rank = 0;
int g_size = 1;
bool g_thread_multiple = false;

std::unique_ptr<HostComm> NewComm(int64_t max_per_call = INT_MAX) {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  return MakeMpiHostComm(dup, max_per_call);
}

// First, so that two threads race to create the float16/bfloat16 MPI types and ops.
TEST(MpiHostCommThreads, ConcurrentCommsOnTwoThreads) {
  if (!g_thread_multiple) GTEST_SKIP() << "MPI_THREAD_MULTIPLE not provided";
  std::unique_ptr<HostComm> a = NewComm();
  std::unique_ptr<HostComm> b = NewComm();
  ASSERT_TRUE(a && b);
  std::thread ta([&] {
    for (int k = 0; k < 10; ++k) {
      CheckAllreduce(*a, Range(0, g_size), DataType::kFloat16, ReduceOp::kSum, 1000, k % 2 == 0);
    }
  });
  std::thread tb([&] {
    for (int k = 0; k < 10; ++k) {
      CheckAllreduce(*b, Range(0, g_size), DataType::kBfloat16, ReduceOp::kMax, 999, k % 2 == 0);
    }
  });
  ta.join();
  tb.join();
}

TEST(MpiHostComm, NullCommunicatorGivesNoComm) {
  EXPECT_EQ(MakeMpiHostComm(MPI_COMM_NULL), nullptr);
}

// With at most 1000 elements (bytes for Broadcast) per MPI call.
TEST(MpiHostComm, AllreduceChunked) {
  std::unique_ptr<HostComm> comm = NewComm(/*max_per_call=*/1000);
  for (DataType t : conformance::AllDtypes()) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (int64_t n : {999, 1000, 1001, 4099}) {
        CheckAllreduce(*comm, Range(0, g_size), t, op, n, false);
        CheckAllreduce(*comm, Range(0, g_size), t, op, n, true);
      }
    }
  }
}

TEST(MpiHostComm, BroadcastChunked) {
  std::unique_ptr<HostComm> comm = NewComm(/*max_per_call=*/1000);
  for (int root = 0; root < g_size; ++root) {
    for (int64_t n : {int64_t{0}, int64_t{999}, int64_t{1000}, int64_t{1001}, int64_t{70003}}) {
      CheckBroadcast(*comm, Range(0, g_size), root, n);
    }
  }
}

// MPI takes int counts and displacements: what does not fit is an InvalidArgument saying so,
// before any MPI call; so is a send_bytes other than this rank's own recv_bytes entry.
TEST(MpiHostComm, LocalArgumentChecks) {
  std::unique_ptr<HostComm> comm = NewComm();
  std::vector<uint8_t> buf(64);
  auto invalid = [](const Status& s) { return s.code() == StatusCode::kInvalidArgument; };
  std::vector<int64_t> huge(g_size, 1);
  huge[0] = int64_t{INT_MAX} + 1;
  const Status s = comm->Allgatherv(buf.data(), huge[g_rank], buf.data(), huge);
  EXPECT_TRUE(invalid(s)) << s.ToString();
  EXPECT_NE(s.message().find("INT_MAX"), std::string::npos) << s.message();
  std::vector<int64_t> far(g_size, INT_MAX / 2 + 1);  // each fits, an offset does not
  if (g_size >= 3) {
    EXPECT_TRUE(invalid(comm->Allgatherv(buf.data(), far[g_rank], buf.data(), far)));
  }
  EXPECT_TRUE(invalid(
      comm->ReduceScatter(buf.data(), buf.data(), huge, DataType::kFloat32, ReduceOp::kSum)));
  std::vector<int64_t> big_total(g_size, INT_MAX / 2 + 1);
  EXPECT_TRUE(invalid(
      comm->ReduceScatter(buf.data(), buf.data(), big_total, DataType::kFloat32, ReduceOp::kSum)));
  // Checked locally too (the conformance suite accepts InvalidArgument or PreconditionError).
  const std::vector<int64_t> ones(g_size, 1);
  EXPECT_TRUE(invalid(comm->Allgatherv(buf.data(), 2, buf.data(), ones)));  // != recv_bytes[me]
  // The communicator still works after all of that.
  CheckAllreduce(*comm, Range(0, g_size), DataType::kInt32, ReduceOp::kSum, 7, false);
}

// Every rank receives one byte less from its right neighbour than that neighbour sends: MPI
// reports a truncation on the receiving side, which must come back as an UnknownError naming the
// call, not abort the job.
TEST(MpiHostComm, MpiErrorBecomesUnknownError) {
  std::unique_ptr<HostComm> comm = NewComm();
  const int right = (g_rank + 1) % g_size;
  std::vector<int64_t> send_bytes(g_size, 4), recv_bytes(g_size, 4);
  recv_bytes[right] = 3;
  std::vector<uint8_t> send(static_cast<size_t>(4 * g_size)), recv(send.size());
  const Status s = comm->Alltoallv(send.data(), send_bytes, recv.data(), recv_bytes);
  EXPECT_EQ(s.code(), StatusCode::kUnknownError) << s.ToString();
  EXPECT_NE(s.message().find("MPI_Alltoallv failed: "), std::string::npos) << s.message();
  EXPECT_GT(s.message().size(), std::string("MPI_Alltoallv failed: ").size());
  (void)comm->Barrier();  // only a wait: every rank finishes before the communicator is freed
}

// More than INT_MAX elements in one Allreduce and Broadcast (several GiB per rank): run only with
// HVDC_TEST_HUGE=1.
TEST(MpiHostComm, HugeCountsLoopInChunks) {
  const char* env = std::getenv("HVDC_TEST_HUGE");
  if (env == nullptr || std::string(env) != "1") GTEST_SKIP() << "set HVDC_TEST_HUGE=1";
  std::unique_ptr<HostComm> comm = NewComm();
  const int64_t n = int64_t{INT_MAX} + 100;
  std::vector<uint8_t> buf(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i += 4096) buf[i] = static_cast<uint8_t>(g_rank + 1);
  buf[n - 1] = static_cast<uint8_t>(g_rank + 1);
  EXPECT_TRUE(comm->Allreduce(buf.data(), buf.data(), n, DataType::kUint8, ReduceOp::kSum).ok());
  const uint8_t want = static_cast<uint8_t>(g_size * (g_size + 1) / 2);
  for (int64_t i = 0; i < n; i += 4096) {
    if (buf[i] != want) {
      ADD_FAILURE() << "element " << i;
      break;
    }
  }
  EXPECT_EQ(buf[n - 1], want);
  EXPECT_EQ(buf[1], 0);
  buf[n - 1] = static_cast<uint8_t>(g_rank);
  EXPECT_TRUE(comm->Broadcast(buf.data(), n, g_size - 1).ok());
  EXPECT_EQ(buf[n - 1], g_size - 1);
}

}  // namespace
}  // namespace hvdc

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &hvdc::g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &hvdc::g_size);
  ::testing::InitGoogleTest(&argc, argv);
  hvdc::g_thread_multiple = provided >= MPI_THREAD_MULTIPLE;
  hvdc_test::PrintOnlyFailuresUnlessRankZero(hvdc::g_rank);
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int ranks_failed = 0;
  MPI_Allreduce(&failed, &ranks_failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (hvdc::g_rank == 0 && ranks_failed > 0) {
    std::fprintf(stderr, "%d of %d ranks had failures\n", ranks_failed, hvdc::g_size);
  }
  MPI_Finalize();
  return ranks_failed > 0 ? 1 : 0;
}

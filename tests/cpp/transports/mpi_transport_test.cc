// What only the MPI transport has, under mpirun (np 2 and 3): topology and the thread level, the
// borrowed-communicator and rank-subset worlds, several transports at once, and Finalize leaving
// an MPI it did not initialize alone. main() initializes MPI itself, so every transport here uses
// an MPI it does not own. The ControlChannel, HostComm and process-set contracts are checked by
// the conformance suites (conformance/mpi_conformance_test.cc).
//
// Collectives are never skipped after a failed check (EXPECT, not ASSERT, around them), so a
// failure cannot turn into a hang. Rank 0 prints gtest's output, other ranks only their failures.
#include "mpi_controller/mpi_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "core/transport.h"
#include "mpi_controller/mpi_context.h"
#include "tests/cpp/conformance/control_channel_checks.h"
#include "tests/cpp/util/rank_failure_printer.h"

namespace hvdc {
namespace {

int g_rank = 0;
int g_size = 1;
int g_provided = MPI_THREAD_SINGLE;

std::unique_ptr<Transport> NewTransport(const MpiTransportOptions& opts = {},
                                        const Config& config = Config()) {
  std::unique_ptr<Transport> t;
  Status s = MakeMpiTransport(config, opts, &t);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return t;
}

std::vector<int> Range(int begin, int end) {
  std::vector<int> v;
  for (int i = begin; i < end; ++i) v.push_back(i);
  return v;
}

TEST(MpiTransport, Topology) {
  std::unique_ptr<Transport> t = NewTransport();
  ASSERT_NE(t, nullptr);
  const Topology& topo = t->topology();
  EXPECT_EQ(topo.rank, g_rank);
  EXPECT_EQ(topo.size, g_size);
  // mpirun on one host: every rank is local.
  EXPECT_EQ(topo.local_rank, g_rank);
  EXPECT_EQ(topo.local_size, g_size);
  EXPECT_EQ(topo.cross_rank, 0);
  EXPECT_EQ(topo.cross_size, 1);
  EXPECT_TRUE(topo.homogeneous);
  EXPECT_STREQ(t->name(), "mpi");
  EXPECT_EQ(t->threads_supported(), g_provided == MPI_THREAD_MULTIPLE);
  t->Finalize();
  t->Finalize();  // idempotent
  int finalized = 1;
  MPI_Finalized(&finalized);
  EXPECT_EQ(finalized, 0) << "the transport finalized an MPI it did not initialize";
}

TEST(MpiTransport, ThreadsDisabled) {
  Config config;
  config.mpi_threads_disable = true;
  std::unique_ptr<Transport> t = NewTransport({}, config);
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->threads_supported());
  t->Finalize();
}

TEST(MpiTransport, BorrowedCommunicator) {
  // The user's communicator orders ranks in reverse; the transport's world follows it.
  MPI_Comm reversed = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, 0, g_size - 1 - g_rank, &reversed);
  MpiTransportOptions opts;
  opts.borrowed_comm = &reversed;
  std::unique_ptr<Transport> t = NewTransport(opts);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->topology().rank, g_size - 1 - g_rank);
  EXPECT_EQ(t->topology().size, g_size);
  ProcessSetChannels set;
  EXPECT_TRUE(t->CreateProcessSet({0}, &set).ok());  // world rank g_size - 1
  EXPECT_EQ(set.control != nullptr, g_rank == g_size - 1);
  set = ProcessSetChannels();
  t->Finalize();
  // The borrowed communicator is still the user's, and still works.
  int one = 1, sum = 0;
  EXPECT_EQ(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, reversed), MPI_SUCCESS);
  EXPECT_EQ(sum, g_size);
  MPI_Comm_free(&reversed);

  MPI_Comm null_comm = MPI_COMM_NULL;
  opts.borrowed_comm = &null_comm;
  std::unique_ptr<Transport> bad;
  EXPECT_EQ(MakeMpiTransport(Config(), opts, &bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad, nullptr);
}

TEST(MpiTransport, RankSubset) {
  // World ranks {last, 0}: in that order, so the last world rank becomes rank 0.
  MpiTransportOptions opts;
  opts.ranks = {g_size - 1, 0};
  std::unique_ptr<Transport> t;
  Status s = MakeMpiTransport(Config(), opts, &t);
  const bool member = g_rank == 0 || g_rank == g_size - 1;
  if (!member) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("not in the requested ranks"), std::string::npos) << s.message();
    EXPECT_EQ(t, nullptr);
  } else {
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(t->topology().size, 2);
    EXPECT_EQ(t->topology().rank, g_rank == 0 ? 1 : 0);
    EXPECT_EQ(t->topology().local_size, 2);
    ProcessSetChannels set;
    EXPECT_TRUE(t->CreateProcessSet({0, 1}, &set).ok());
    if (set.control) conformance::ExerciseChannel(*set.control, {g_size - 1, 0}, 5);
    bool equal = false;
    EXPECT_TRUE(t->CheckAgreement(42, &equal).ok());
    EXPECT_TRUE(equal);
    set = ProcessSetChannels();
    t->Finalize();
  }
  // Bad lists fail everywhere, before any communication.
  opts.ranks = {0, 0};
  EXPECT_EQ(MakeMpiTransport(Config(), opts, &t).code(), StatusCode::kInvalidArgument);
  opts.ranks = {g_size};
  EXPECT_EQ(MakeMpiTransport(Config(), opts, &t).code(), StatusCode::kInvalidArgument);
  opts.ranks = {0};
  MPI_Comm comm = MPI_COMM_WORLD;
  opts.borrowed_comm = &comm;
  EXPECT_EQ(MakeMpiTransport(Config(), opts, &t).code(), StatusCode::kInvalidArgument);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(MpiTransport, SeveralTransportsAtOnce) {
  std::unique_ptr<Transport> a = NewTransport();
  std::unique_ptr<Transport> b = NewTransport();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ProcessSetChannels sa, sb;
  EXPECT_TRUE(a->CreateProcessSet(Range(0, g_size), &sa).ok());
  a->Finalize();  // b keeps working
  EXPECT_TRUE(b->CreateProcessSet(Range(0, g_size), &sb).ok());
  if (sb.control) conformance::ExerciseChannel(*sb.control, Range(0, g_size), 3);
  // Channels outliving their transport still work and free their communicators.
  if (sa.control) conformance::ExerciseChannel(*sa.control, Range(0, g_size), 3);
  sa = ProcessSetChannels();
  sb = ProcessSetChannels();
  b->Finalize();
}

}  // namespace
}  // namespace hvdc

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &hvdc::g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &hvdc::g_size);
  MPI_Query_thread(&hvdc::g_provided);
  ::testing::InitGoogleTest(&argc, argv);
  hvdc_test::PrintOnlyFailuresUnlessRankZero(hvdc::g_rank);
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int ranks_failed = 0;
  MPI_Allreduce(&failed, &ranks_failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (hvdc::g_rank == 0 && ranks_failed > 0) {
    std::fprintf(stderr, "%d rank(s) failed\n", ranks_failed);
  }
  MPI_Finalize();
  return ranks_failed > 0 ? 1 : 0;
}

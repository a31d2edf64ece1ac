// What only the in-memory world has, over worlds of 1..8 ranks as threads: its topology, the
// shared slots of the control board and the rendezvous freed after every operation (abandoned
// ones included), arguments validated across ranks (a mismatch fails on every rank and the world
// stays in step), and a rank that never arrives as an error naming it. The ControlChannel,
// HostComm and process-set contracts are checked by the conformance suites
// (conformance/local_conformance_test.cc).
#include "local_controller/local_world.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/transport.h"
#include "local_controller/local_channel.h"
#include "local_controller/local_host_comm.h"
#include "ops/cpu/kernels.h"
#include "tests/cpp/conformance/control_channel_checks.h"
#include "tests/cpp/conformance/host_comm_checks.h"

namespace hvdc {
namespace {

using RankFn = std::function<void(int rank, Transport& transport)>;

// Runs fn on `size` threads, one per rank, each with its own Transport over one shared world.
void RunRanks(int size, const RankFn& fn,
              std::chrono::milliseconds timeout = LocalWorld::kDefaultArrivalTimeout) {
  std::shared_ptr<LocalWorld> world = LocalWorld::Create(size, timeout);
  ASSERT_NE(world, nullptr);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&world, &fn, r] {
      std::unique_ptr<Transport> transport = MakeLocalTransport(world, r);
      ASSERT_NE(transport, nullptr);
      fn(r, *transport);
    });
  }
  for (std::thread& t : threads) t.join();
}

std::vector<int> Range(int begin, int end) {
  std::vector<int> v;
  for (int i = begin; i < end; ++i) v.push_back(i);
  return v;
}

ProcessSetChannels MakeSet(Transport& transport, const std::vector<int>& ranks) {
  ProcessSetChannels channels;
  Status s = transport.CreateProcessSet(ranks, &channels);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return channels;
}

Status Wait(std::unique_ptr<PendingOp> op) {
  Status status;
  while (!op->Test(&status)) std::this_thread::yield();
  return status;
}

// Checks that the set's shared slots have all been freed (call once every rank's thread is done).
void ExpectNoSlots(ProcessSetChannels& set) {
  auto* control = dynamic_cast<local::LocalControlChannel*>(set.control.get());
  auto* data = dynamic_cast<local::LocalHostComm*>(set.data.get());
  ASSERT_NE(control, nullptr);
  ASSERT_NE(data, nullptr);
  EXPECT_EQ(control->board().slots_in_use(), 0u);
  EXPECT_EQ(data->rendezvous().slots_in_use(), 0u);
}

class LocalWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(LocalWorldTest, Topology) {
  const int n = GetParam();
  RunRanks(n, [n](int rank, Transport& t) {
    const Topology& topo = t.topology();
    EXPECT_EQ(topo.rank, rank);
    EXPECT_EQ(topo.size, n);
    EXPECT_EQ(topo.local_rank, rank);
    EXPECT_EQ(topo.local_size, n);
    EXPECT_EQ(topo.cross_rank, 0);
    EXPECT_EQ(topo.cross_size, 1);
    EXPECT_TRUE(topo.homogeneous);
    EXPECT_STREQ(t.name(), "local");
    EXPECT_TRUE(t.threads_supported());
    t.Finalize();
  });
}

// ---- control channel ----

// Every kind of operation, then no slot left on the board or the rendezvous.
TEST_P(LocalWorldTest, EveryOperationFreesItsSlots) {
  const int n = GetParam();
  std::vector<ProcessSetChannels> kept(n);
  RunRanks(n, [n, &kept](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    conformance::ExerciseChannel(*set.control, Range(0, n), 8);
    const std::vector<int> all = Range(0, n);
    conformance::CheckAllreduce(*set.data, all, DataType::kFloat32, ReduceOp::kSum, 1001, false);
    conformance::CheckAllreduce(*set.data, all, DataType::kInt8, ReduceOp::kMax, 7, true);
    std::vector<int64_t> bytes(n), counts(n);
    for (int q = 0; q < n; ++q) {
      bytes[q] = q == 0 ? 0 : 3 * q;
      counts[q] = q + 1;
    }
    conformance::CheckAllgatherv(*set.data, all, bytes, true);
    conformance::CheckBroadcast(*set.data, all, n - 1, 999);
    conformance::CheckAlltoallv(*set.data, all, [](int a, int b) { return int64_t{a + b}; });
    conformance::CheckReduceScatter(*set.data, all, DataType::kBfloat16, ReduceOp::kSum, counts,
                                    true);
    EXPECT_TRUE(set.data->Barrier().ok());
    kept[rank] = std::move(set);
  });
  for (ProcessSetChannels& set : kept) ExpectNoSlots(set);
}

TEST_P(LocalWorldTest, ControlAbandonedOpStillFreesSlot) {
  const int n = GetParam();
  std::vector<ProcessSetChannels> kept(n);
  RunRanks(n, [n, &kept](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    {
      std::vector<uint64_t> bits = {1};
      std::unique_ptr<PendingOp> op = set.control->StartBitAnd(&bits);
      if (rank % 2 == 1) {
        op.reset();  // never tested: the destructor still releases this rank's share
      } else {
        EXPECT_TRUE(Wait(std::move(op)).ok());
      }
    }
    kept[rank] = std::move(set);
  });
  for (ProcessSetChannels& set : kept) ExpectNoSlots(set);
}

TEST_P(LocalWorldTest, ControlMismatchedLengthsFailEverywhere) {
  const int n = GetParam();
  if (n == 1) GTEST_SKIP() << "needs two ranks";
  RunRanks(n, [](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, t.topology().size));
    std::vector<uint64_t> bits(rank == 1 ? 2 : 1, ~uint64_t{0});
    Status s = Wait(set.control->StartBitAnd(&bits));
    EXPECT_EQ(s.code(), StatusCode::kPreconditionError) << s.ToString();
    // The channel stays usable: the next operation matches again.
    std::vector<uint64_t> again = {~uint64_t{0} << rank};
    ASSERT_TRUE(Wait(set.control->StartBitAnd(&again)).ok());
    EXPECT_EQ(again[0], ~uint64_t{0} << (t.topology().size - 1));
  });
}

TEST_P(LocalWorldTest, DataPlaneMismatchFailsEverywhereAndRecovers) {
  const int n = GetParam();
  if (n == 1) GTEST_SKIP() << "needs two ranks";
  std::vector<ProcessSetChannels> kept(n);
  RunRanks(n, [n, &kept](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    std::vector<float> v(10, 1.0f);
    Status s = set.data->Allreduce(v.data(), v.data(), rank == n - 1 ? 9 : 10, DataType::kFloat32,
                                   ReduceOp::kSum);
    EXPECT_EQ(s.code(), StatusCode::kPreconditionError) << s.ToString();
    // A different collective on one rank is also an error on every rank.
    if (rank == 0) {
      s = set.data->Barrier();
    } else {
      s = set.data->Broadcast(v.data(), 4, 0);
    }
    EXPECT_EQ(s.code(), StatusCode::kPreconditionError) << s.ToString();
    // Bad arguments: the same verdict everywhere, from the rank that passed them.
    s = set.data->Broadcast(v.data(), 4, rank == 0 ? n : 0);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_EQ(s.origin_rank(), rank == 0 ? -1 : 0) << s.ToString();
    // Sequence numbers stay aligned.
    std::fill(v.begin(), v.end(), 1.0f);
    s = set.data->Allreduce(v.data(), v.data(), 10, DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(v[9], static_cast<float>(n));
    kept[rank] = std::move(set);
  });
  for (ProcessSetChannels& set : kept) ExpectNoSlots(set);
}

INSTANTIATE_TEST_SUITE_P(Sizes, LocalWorldTest, ::testing::Values(1, 2, 3, 4, 7, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "np" + std::to_string(info.param);
                         });

// ---- outside the matrix ----

TEST(LocalWorld, RejectsBadArguments) {
  EXPECT_EQ(LocalWorld::Create(0), nullptr);
  std::shared_ptr<LocalWorld> world = LocalWorld::Create(2);
  EXPECT_EQ(MakeLocalTransport(world, 2), nullptr);
  EXPECT_EQ(MakeLocalTransport(world, -1), nullptr);
  EXPECT_EQ(MakeLocalTransport(nullptr, 0), nullptr);
}

TEST(LocalWorld, MissingRankIsAnErrorNotAHang) {
  const auto timeout = std::chrono::milliseconds(300);
  RunRanks(
      3,
      [](int rank, Transport& t) {
        ProcessSetChannels set = MakeSet(t, {0, 1, 2});
        if (rank == 2) return;  // never joins the allreduce
        std::vector<float> v(4, 1.0f);
        Status s = set.data->Allreduce(v.data(), v.data(), 4, DataType::kFloat32, ReduceOp::kSum);
        EXPECT_EQ(s.code(), StatusCode::kUnknownError);
        EXPECT_NE(s.message().find("rank(s) 2 did not arrive"), std::string::npos) << s.message();
      },
      timeout);
  // The world's own collectives time out the same way.
  RunRanks(
      2,
      [](int rank, Transport& t) {
        if (rank == 1) return;
        bool equal = false;
        Status s = t.CheckAgreement(1, &equal);
        EXPECT_EQ(s.code(), StatusCode::kUnknownError);
        EXPECT_NE(s.message().find("rank(s) 1 did not arrive"), std::string::npos) << s.message();
      },
      timeout);
}

TEST(LocalWorld, SetRanksAreNamedByWorldRank) {
  const auto timeout = std::chrono::milliseconds(300);
  RunRanks(
      4,
      [](int rank, Transport& t) {
        ProcessSetChannels set = MakeSet(t, {1, 3});
        if (rank != 1) return;  // world rank 3 never joins
        Status s = set.data->Barrier();
        EXPECT_NE(s.message().find("rank(s) 3 did not arrive"), std::string::npos) << s.message();
      },
      timeout);
}

}  // namespace
}  // namespace hvdc

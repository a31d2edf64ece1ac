// HostComm's argument check, the one every data plane gets: bad arguments never reach an
// implementation (its Refuse runs instead, with InvalidArgument), good ones reach it unchanged.
// A recording fake stands in for a transport, at every rank of sets of 1 to 4.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/host_comm.h"

namespace hvdc {
namespace {

using Collective = HostComm::Collective;

class RecordingComm : public HostComm {
 public:
  RecordingComm(int rank, int size, bool pieces = true)
      : rank_(rank), size_(size), pieces_(pieces) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool allreduces_pieces() const override { return pieces_; }

  std::vector<std::string> ran;  // the hooks that ran, in order
  std::vector<Collective> refused;

 private:
  Status DoAllreduce(const void*, void*, int64_t, DataType, ReduceOp) override {
    return Ran("Allreduce");
  }
  Status DoAllgatherv(const void*, int64_t, void*, const std::vector<int64_t>&) override {
    return Ran("Allgatherv");
  }
  Status DoBroadcast(void*, int64_t, int) override { return Ran("Broadcast"); }
  Status DoAlltoallv(const void*, const std::vector<int64_t>&, void*,
                     const std::vector<int64_t>&) override {
    return Ran("Alltoallv");
  }
  Status DoReduceScatter(const void*, void*, const std::vector<int64_t>&, DataType,
                         ReduceOp) override {
    return Ran("ReduceScatter");
  }
  Status DoBarrier() override { return Ran("Barrier"); }
  Status DoAllreducePieces(const std::vector<ReducePiece>&, DataType, ReduceOp, double,
                           double) override {
    return Ran("AllreducePieces");
  }
  Status Refuse(Collective c, Status error) override {
    refused.push_back(c);
    return HostComm::Refuse(c, std::move(error));
  }
  Status Ran(const char* what) {
    ran.push_back(what);
    return Status::OK();
  }

  const int rank_;
  const int size_;
  const bool pieces_;
};

class HostCommCheckTest : public ::testing::TestWithParam<int> {};

// Runs `call` on a fresh comm for every rank of the set and expects it refused as `c`.
template <typename Call>
void ExpectRefused(int size, Collective c, Call call) {
  for (int rank = 0; rank < size; ++rank) {
    RecordingComm comm(rank, size);
    const Status s = call(comm, rank);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(HostComm::CollectiveName(c)), std::string::npos) << s.message();
    EXPECT_TRUE(comm.ran.empty()) << comm.ran.front();
    EXPECT_EQ(comm.refused, std::vector<Collective>{c});
  }
}

TEST_P(HostCommCheckTest, BadArgumentsNeverReachTheImplementation) {
  const int n = GetParam();
  const std::vector<int64_t> ones(n, 1), too_many(n + 1, 1);
  std::vector<int64_t> negative_last(n, 1);
  negative_last[n - 1] = -1;
  const auto f32 = DataType::kFloat32;

  ExpectRefused(n, Collective::kAllreduce, [&](HostComm& c, int) {
    return c.Allreduce(nullptr, nullptr, -1, f32, ReduceOp::kSum);
  });
  ExpectRefused(n, Collective::kAllreduce, [&](HostComm& c, int) {
    return c.Allreduce(nullptr, nullptr, 4, f32, ReduceOp::kAdasum);
  });
  ExpectRefused(n, Collective::kAllreduce, [&](HostComm& c, int) {
    return c.Allreduce(nullptr, nullptr, 4, static_cast<DataType>(kNumDataTypes), ReduceOp::kSum);
  });
  ExpectRefused(n, Collective::kAllgatherv,
                [&](HostComm& c, int) { return c.Allgatherv(nullptr, -1, nullptr, ones); });
  ExpectRefused(n, Collective::kAllgatherv,
                [&](HostComm& c, int) { return c.Allgatherv(nullptr, 1, nullptr, too_many); });
  ExpectRefused(n, Collective::kAllgatherv, [&](HostComm& c, int rank) {
    return c.Allgatherv(nullptr, negative_last[rank], nullptr, negative_last);
  });
  ExpectRefused(n, Collective::kAllgatherv,  // sends other than its own recv_bytes entry
                [&](HostComm& c, int) { return c.Allgatherv(nullptr, 2, nullptr, ones); });
  ExpectRefused(n, Collective::kBroadcast,
                [&](HostComm& c, int) { return c.Broadcast(nullptr, -1, 0); });
  ExpectRefused(n, Collective::kBroadcast,
                [&](HostComm& c, int) { return c.Broadcast(nullptr, 1, n); });
  ExpectRefused(n, Collective::kBroadcast,
                [&](HostComm& c, int) { return c.Broadcast(nullptr, 1, -1); });
  ExpectRefused(n, Collective::kAlltoallv,
                [&](HostComm& c, int) { return c.Alltoallv(nullptr, too_many, nullptr, ones); });
  ExpectRefused(n, Collective::kAlltoallv, [&](HostComm& c, int) {
    return c.Alltoallv(nullptr, ones, nullptr, negative_last);
  });
  ExpectRefused(n, Collective::kAlltoallv, [&](HostComm& c, int rank) {
    std::vector<int64_t> to_self(ones);
    to_self[rank] = 2;  // sends itself 2 bytes but expects 1
    return c.Alltoallv(nullptr, to_self, nullptr, ones);
  });
  ExpectRefused(n, Collective::kReduceScatter, [&](HostComm& c, int) {
    return c.ReduceScatter(nullptr, nullptr, too_many, f32, ReduceOp::kSum);
  });
  ExpectRefused(n, Collective::kReduceScatter, [&](HostComm& c, int) {
    return c.ReduceScatter(nullptr, nullptr, negative_last, f32, ReduceOp::kSum);
  });
  ExpectRefused(n, Collective::kReduceScatter, [&](HostComm& c, int) {
    return c.ReduceScatter(nullptr, nullptr, ones, f32, ReduceOp::kAdasum);
  });
  float a[8] = {};
  ExpectRefused(n, Collective::kAllreduce, [&](HostComm& c, int) {
    return c.AllreducePieces({{a, a, 2}, {nullptr, nullptr, -1}}, f32, ReduceOp::kSum, 1, 1);
  });
  ExpectRefused(n, Collective::kAllreduce, [&](HostComm& c, int) {
    return c.AllreducePieces({{a, a, 2}}, f32, ReduceOp::kAdasum, 1, 1);
  });
  ExpectRefused(n, Collective::kAllreduce, [&](HostComm& c, int) {  // an output over an input
    return c.AllreducePieces({{a, a + 4, 4}, {a + 6, a + 6, 2}}, f32, ReduceOp::kSum, 1, 1);
  });
}

TEST(HostCommPieces, OnlyOutputsMayNotOverlap) {
  float a[16] = {};
  auto overlap = [](const std::vector<ReducePiece>& p) { return PiecesOverlap(p, 4); };
  EXPECT_FALSE(overlap({}));
  EXPECT_FALSE(overlap({{a, a, 16}}));                           // in place
  EXPECT_FALSE(overlap({{a, a + 8, 8}}));                        // out of place, disjoint
  EXPECT_FALSE(overlap({{a, a + 4, 4}, {a, a + 8, 4}}));         // inputs shared: read only
  EXPECT_TRUE(overlap({{a, a + 8, 8}, {a + 8, nullptr, 8}}));    // reads another's output
  EXPECT_FALSE(overlap({{a, a, 4}, {a + 4, a + 4, 4}}));         // adjacent
  EXPECT_FALSE(overlap({{nullptr, nullptr, 4}, {a, a, 4}}));     // joined piece
  EXPECT_FALSE(overlap({{a, a + 1, 0}, {a + 1, a + 1, 2}}));     // empty piece
  EXPECT_TRUE(overlap({{a, a, 4}, {a + 3, a + 8, 2}}));          // reads another's output
  EXPECT_TRUE(overlap({{a, a + 2, 4}}));                         // partly in place
  EXPECT_TRUE(overlap({{a, a + 8, 4}, {a + 4, a + 10, 4}}));     // outputs overlap
  EXPECT_TRUE(overlap({{nullptr, a, 4}, {nullptr, a + 3, 4}}));  // outputs overlap
}

// A data plane that does not implement it says so (the caller packs a buffer instead).
TEST(HostCommPieces, UnsupportedIsAPreconditionError) {
  RecordingComm comm(0, 2, /*pieces=*/false);
  float a[4] = {};
  const Status s = comm.AllreducePieces({{a, a, 4}}, DataType::kFloat32, ReduceOp::kSum, 1, 1);
  EXPECT_EQ(s.code(), StatusCode::kPreconditionError) << s.ToString();
  EXPECT_TRUE(comm.ran.empty());
}

TEST_P(HostCommCheckTest, GoodArgumentsReachTheImplementation) {
  const int n = GetParam();
  for (int rank = 0; rank < n; ++rank) {
    RecordingComm comm(rank, n);
    std::vector<int64_t> uneven(n);
    for (int r = 0; r < n; ++r) uneven[r] = r;  // rank r sends r bytes (rank 0: none)
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      EXPECT_TRUE(comm.Allreduce(nullptr, nullptr, 0, DataType::kBfloat16, op).ok());
    }
    EXPECT_TRUE(comm.Allgatherv(nullptr, rank, nullptr, uneven).ok());
    EXPECT_TRUE(comm.Broadcast(nullptr, 0, n - 1).ok());
    EXPECT_TRUE(comm.Alltoallv(nullptr, uneven, nullptr, uneven).ok());
    EXPECT_TRUE(comm.ReduceScatter(nullptr, nullptr, uneven, DataType::kInt8, ReduceOp::kMax).ok());
    EXPECT_TRUE(comm.Barrier().ok());
    float a[4] = {};
    EXPECT_TRUE(comm.AllreducePieces({{a, a, 2}, {nullptr, nullptr, 0}, {a + 2, nullptr, 2}},
                                     DataType::kFloat32, ReduceOp::kSum, 0.5, 2)
                    .ok());
    const std::vector<std::string> expected = {
        "Allreduce", "Allreduce", "Allreduce",     "Allreduce", "Allreduce",      "Allgatherv",
        "Broadcast", "Alltoallv", "ReduceScatter", "Barrier",   "AllreducePieces"};
    EXPECT_EQ(comm.ran, expected);
    EXPECT_TRUE(comm.refused.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, HostCommCheckTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "np" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace hvdc

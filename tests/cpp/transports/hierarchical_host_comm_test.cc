// HierarchicalHostComm (shm_controller/hierarchical_host_comm.h): the host layout every rank
// computes; allreduce and allgatherv over 3 hosts x 2 ranks, host-contiguous and interleaved,
// every dtype family and op, sizes 0, 1, odd and several segments; fp32 sums bitwise the same on
// every rank; process sets that span some hosts; when it is used and when a set keeps the flat
// plane (off, one rank per host, 2+1 ranks, ranks that disagree). Ranks as threads over the
// in-memory world, each with the host identity the test gives it.
#include "shm_controller/hierarchical_host_comm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "local_controller/local_world.h"
#include "shm_controller/host_layout.h"
#include "shm_controller/shm_host_comm.h"
#include "shm_controller/shm_transport.h"
#include "tests/cpp/conformance/suite_util.h"
#include "tests/cpp/conformance/values.h"

namespace hvdc {
namespace {

using conformance::CheckReduced;
using conformance::Inputs;
using conformance::MakeSet;
using conformance::Range;
using conformance::ThreadWorld;
using conformance::World;
using shm::HierarchicalHostComm;
using shm::HostLayout;

constexpr int64_t kSegment = 64 * 1024;
const std::vector<std::string> kThreeByTwo = {"a", "a", "b", "b", "c", "c"};
const std::vector<std::string> kInterleaved = {"a", "b", "c", "a", "b", "c"};

shm::ShmOptions Options(bool allreduce = true, bool allgather = true, bool shm = true) {
  shm::ShmOptions o;
  o.enabled = shm;
  o.bytes = kSegment;
  o.hierarchical_allreduce = allreduce;
  o.hierarchical_allgather = allgather;
  return o;
}

// Rank r on hosts[r], with options_of(r).
std::unique_ptr<World> MakeWorld(const std::vector<std::string>& hosts,
                                 const std::function<shm::ShmOptions(int)>& options_of) {
  return ThreadWorld::Make(static_cast<int>(hosts.size()), [&](int size) {
    std::shared_ptr<LocalWorld> world = LocalWorld::Create(size);
    std::vector<std::unique_ptr<Transport>> out;
    for (int r = 0; r < size; ++r) {
      shm::ShmOptions o = options_of(r);
      o.host = hosts[static_cast<size_t>(r)];
      out.push_back(shm::MakeShmTransport(MakeLocalTransport(world, r), o));
    }
    return out;
  });
}

std::unique_ptr<World> MakeWorld(const std::vector<std::string>& hosts,
                                 const shm::ShmOptions& options = Options()) {
  return MakeWorld(hosts, [&](int) { return options; });
}

HierarchicalHostComm* AsHierarchical(const ProcessSetChannels& set) {
  return dynamic_cast<HierarchicalHostComm*>(set.data.get());
}

// Allreduce of the conformance inputs over `comm` (set `members`, world ranks), in place and not,
// checked exactly against the computed reduction.
void CheckAllreduce(HostComm& comm, const std::vector<int>& members, int world_rank, DataType dtype,
                    ReduceOp op, int64_t count) {
  const std::string what = std::string(DataTypeName(dtype)) + " " + ReduceOpName(op) + " x " +
                           std::to_string(count) + " on rank " + std::to_string(world_rank);
  std::vector<uint8_t> in = Inputs(dtype, op, world_rank, count);
  std::vector<uint8_t> out(in.size(), 0xcd);
  out.back() = 0xee;
  Status s = comm.Allreduce(in.data(), out.data(), count, dtype, op);
  EXPECT_TRUE(s.ok()) << what << ": " << s.ToString();
  CheckReduced(dtype, op, members, out.data(), count, 0, what);
  EXPECT_EQ(out.back(), 0xee) << what << ": wrote past the end";
  s = comm.Allreduce(in.data(), in.data(), count, dtype, op);  // in place
  EXPECT_TRUE(s.ok()) << what << ": " << s.ToString();
  CheckReduced(dtype, op, members, in.data(), count, 0, what + " (in place)");
}

// Allgatherv with rank r sending BytesOf(r) bytes; checked byte by byte, then in place.
int64_t BytesOf(int set_rank, int64_t scale) { return (set_rank * 37 + 11) % 53 * scale; }

void CheckAllgatherv(HostComm& comm, int64_t scale, const std::string& what) {
  const int n = comm.size(), me = comm.rank();
  std::vector<int64_t> sizes(static_cast<size_t>(n));
  int64_t total = 0;
  for (int r = 0; r < n; ++r) total += sizes[static_cast<size_t>(r)] = BytesOf(r, scale);
  std::vector<uint8_t> send(static_cast<size_t>(sizes[static_cast<size_t>(me)]));
  for (size_t i = 0; i < send.size(); ++i) send[i] = conformance::Byte(me, 0, i);
  std::vector<uint8_t> recv(static_cast<size_t>(total) + 1, 0xcd);
  recv.back() = 0xee;
  Status s = comm.Allgatherv(send.data(), static_cast<int64_t>(send.size()), recv.data(), sizes);
  EXPECT_TRUE(s.ok()) << what << ": " << s.ToString();
  int64_t at = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(conformance::FirstBadByte(recv.data() + at, sizes[static_cast<size_t>(r)], r, 0), -1)
        << what << ": block of set rank " << r << " on rank " << me;
    at += sizes[static_cast<size_t>(r)];
  }
  EXPECT_EQ(recv.back(), 0xee) << what << ": wrote past the end";
  // In place: this rank's block already sits where it belongs.
  std::vector<uint8_t> inplace(static_cast<size_t>(total) + 1, 0xcd);  // never empty
  int64_t mine = 0;
  for (int r = 0; r < me; ++r) mine += sizes[static_cast<size_t>(r)];
  if (!send.empty()) std::memcpy(inplace.data() + mine, send.data(), send.size());
  s = comm.Allgatherv(inplace.data() + mine, static_cast<int64_t>(send.size()), inplace.data(),
                      sizes);
  EXPECT_TRUE(s.ok()) << what << ": " << s.ToString();
  EXPECT_EQ(std::memcmp(inplace.data(), recv.data(), static_cast<size_t>(total)), 0)
      << what << ": in place differs";
}

TEST(HostLayout, GroupsByHostInOrderOfFirstRank) {
  const std::vector<int> world = Range(0, 6);
  HostLayout l = HostLayout::Of(world, kInterleaved);
  EXPECT_EQ(l.hosts, (std::vector<std::vector<int>>{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_EQ(l.local_size(), 2);
  EXPECT_EQ(l.CrossGroup(0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(l.CrossGroup(1), (std::vector<int>{3, 4, 5}));
  int host = 0, local = 0;
  l.Locate(4, &host, &local);
  EXPECT_EQ(host, 1);
  EXPECT_EQ(local, 1);

  // A cross group whose rank order is not the host order.
  l = HostLayout::Of(Range(0, 4), {"a", "b", "b", "a"});
  EXPECT_EQ(l.hosts, (std::vector<std::vector<int>>{{0, 3}, {1, 2}}));
  EXPECT_EQ(l.CrossGroup(1), (std::vector<int>{2, 3}));
  EXPECT_EQ(l.CrossHosts(1), (std::vector<int>{1, 0}));

  // A subset: set ranks, not world ranks.
  l = HostLayout::Of({1, 2, 4, 5}, kThreeByTwo);
  EXPECT_EQ(l.hosts, (std::vector<std::vector<int>>{{0}, {1}, {2, 3}}));
  EXPECT_EQ(l.local_size(), 0);
  EXPECT_EQ(HostLayout::Of(Range(0, 3), {"a", "a", "b"}).local_size(), 0);
}

TEST(HierarchicalHostComm, AllreduceEveryDtypeFamilyOpAndSize) {
  for (const auto& hosts : {kThreeByTwo, kInterleaved}) {
    auto world = MakeWorld(hosts);
    ASSERT_NE(world, nullptr);
    world->Run([&](Transport& t) {
      ProcessSetChannels set = MakeSet(t, Range(0, 6));
      HierarchicalHostComm* h = AsHierarchical(set);
      EXPECT_NE(h, nullptr);
      if (!h) return;
      EXPECT_NE(dynamic_cast<shm::ShmHostComm*>(&h->local()), nullptr);
      for (DataType dtype : {DataType::kInt32, DataType::kFloat32, DataType::kFloat16,
                             DataType::kBfloat16, DataType::kFloat64}) {
        const int64_t es = static_cast<int64_t>(DataTypeSize(dtype));
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
          for (int64_t count :
               {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{1001}, kSegment * 7 / 2 / es + 3}) {
            CheckAllreduce(*h, Range(0, 6), t.topology().rank, dtype, op, count);
          }
        }
      }
      CheckAllreduce(*h, Range(0, 6), t.topology().rank, DataType::kInt64, ReduceOp::kProduct, 77);
      CheckAllreduce(*h, Range(0, 6), t.topology().rank, DataType::kFloat32, ReduceOp::kAverage,
                     77);
    });
  }
}

// Values of very different magnitudes, so that a different order of addition gives different
// bits: every rank must still hold exactly the same bits.
TEST(HierarchicalHostComm, Fp32SumIsBitIdenticalOnEveryRank) {
  const int64_t count = kSegment * 3 / 4 + 7;  // several segments at 6 ranks
  for (const auto& hosts : {kThreeByTwo, kInterleaved}) {
    std::vector<std::vector<float>> results(6);
    auto world = MakeWorld(hosts);
    ASSERT_NE(world, nullptr);
    world->Run([&](Transport& t) {
      ProcessSetChannels set = MakeSet(t, Range(0, 6));
      EXPECT_NE(AsHierarchical(set), nullptr);
      const int r = t.topology().rank;
      std::vector<float> buf(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        const double scale = std::pow(10.0, (r * 3 + i) % 8);
        buf[static_cast<size_t>(i)] =
            static_cast<float>(scale * (1.0 / 3 + ((i * 13 + r * 7) % 17) - 8));
      }
      Status s =
          set.data->Allreduce(buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum);
      EXPECT_TRUE(s.ok()) << s.ToString();
      results[static_cast<size_t>(r)] = std::move(buf);
    });
    int bad = 0;
    for (int64_t i = 0; i < count; ++i) {
      double expected = 0, magnitude = 0;
      for (int r = 0; r < 6; ++r) {
        const double scale = std::pow(10.0, (r * 3 + i) % 8);
        const double v = static_cast<float>(scale * (1.0 / 3 + ((i * 13 + r * 7) % 17) - 8));
        expected += v;
        magnitude += std::fabs(v);
      }
      if (std::fabs(results[0][static_cast<size_t>(i)] - expected) > 1e-6 * magnitude) ++bad;
    }
    EXPECT_EQ(bad, 0);
    for (int r = 1; r < 6; ++r) {
      ASSERT_EQ(results[static_cast<size_t>(r)].size(), static_cast<size_t>(count));
      EXPECT_EQ(std::memcmp(results[static_cast<size_t>(r)].data(), results[0].data(),
                            static_cast<size_t>(count) * sizeof(float)),
                0)
          << "rank " << r << " differs from rank 0";
    }
  }
}

TEST(HierarchicalHostComm, AllgathervUnevenSizesInSetRankOrder) {
  for (const auto& hosts : {kThreeByTwo, kInterleaved}) {
    auto world = MakeWorld(hosts);
    ASSERT_NE(world, nullptr);
    world->Run([&](Transport& t) {
      ProcessSetChannels set = MakeSet(t, Range(0, 6));
      EXPECT_NE(AsHierarchical(set), nullptr);
      if (!set.data) return;
      for (int64_t scale : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{4001}}) {
        CheckAllgatherv(*set.data, scale, hosts[1] + " scale " + std::to_string(scale));
      }
    });
  }
}

// Sets that span some of the hosts: {0,1,4,5} (hosts a and c, two each) is hierarchical; so is
// {0,1,2,3}, made before the world set (the hosts are then gathered over a world set of its
// own); {0,2,4} (one rank per host) and {0,1,2} (2+1) keep the flat plane. Every result checked.
TEST(HierarchicalHostComm, ProcessSetsSpanningSomeHosts) {
  auto world = MakeWorld(kThreeByTwo);
  ASSERT_NE(world, nullptr);
  world->Run([&](Transport& t) {
    const int me = t.topology().rank;
    ProcessSetChannels first = MakeSet(t, {0, 1, 2, 3});
    ProcessSetChannels all = MakeSet(t, Range(0, 6));
    ProcessSetChannels ends = MakeSet(t, {0, 1, 4, 5});
    ProcessSetChannels across = MakeSet(t, {0, 2, 4});
    ProcessSetChannels uneven = MakeSet(t, {0, 1, 2});
    EXPECT_NE(AsHierarchical(all), nullptr);
    const struct {
      const ProcessSetChannels& set;
      std::vector<int> members;
      bool hierarchical;
    } cases[] = {{first, {0, 1, 2, 3}, true},
                 {ends, {0, 1, 4, 5}, true},
                 {across, {0, 2, 4}, false},
                 {uneven, {0, 1, 2}, false}};
    for (const auto& c : cases) {
      const bool member = std::find(c.members.begin(), c.members.end(), me) != c.members.end();
      EXPECT_EQ(c.set.data != nullptr, member);
      if (!member) continue;
      EXPECT_EQ(AsHierarchical(c.set) != nullptr, c.hierarchical) << c.members.size();
      CheckAllreduce(*c.set.data, c.members, me, DataType::kFloat32, ReduceOp::kSum, 3001);
      CheckAllreduce(*c.set.data, c.members, me, DataType::kInt32, ReduceOp::kMax, 7);
      CheckAllgatherv(*c.set.data, 5, "set of " + std::to_string(c.members.size()));
    }
  });
}

TEST(HierarchicalHostComm, UnevenHostsFallBackToFlat) {
  auto world = MakeWorld({"a", "a", "b"});
  ASSERT_NE(world, nullptr);
  world->Run([&](Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, 3));
    EXPECT_EQ(AsHierarchical(set), nullptr);
    EXPECT_EQ(dynamic_cast<shm::ShmHostComm*>(set.data.get()), nullptr);
    if (!set.data) return;
    CheckAllreduce(*set.data, Range(0, 3), t.topology().rank, DataType::kFloat32, ReduceOp::kSum,
                   kSegment / 2 + 1);
    CheckAllgatherv(*set.data, 7, "2+1");
  });
}

TEST(HierarchicalHostComm, UsedOnlyWhenAskedFor) {
  struct Case {
    shm::ShmOptions options;
    bool hierarchical, allreduce, allgather;
  };
  for (const Case& c : {Case{Options(false, false), false, false, false},
                        Case{Options(true, false), true, true, false},
                        Case{Options(false, true), true, false, true}}) {
    auto world = MakeWorld(kThreeByTwo, c.options);
    ASSERT_NE(world, nullptr);
    world->Run([&](Transport& t) {
      ProcessSetChannels set = MakeSet(t, Range(0, 6));
      HierarchicalHostComm* h = AsHierarchical(set);
      EXPECT_EQ(h != nullptr, c.hierarchical);
      if (h) {
        EXPECT_EQ(h->hierarchical_allreduce(), c.allreduce);
        EXPECT_EQ(h->hierarchical_allgather(), c.allgather);
      }
      if (!set.data) return;
      CheckAllreduce(*set.data, Range(0, 6), t.topology().rank, DataType::kInt32, ReduceOp::kSum,
                     1001);
      CheckAllgatherv(*set.data, 3, "switches");
    });
  }
}

// HVDC_SHM=0: still hierarchical, the host groups over the transport's own sub-communicators.
TEST(HierarchicalHostComm, WithoutSharedMemoryTheHostGroupIsTheTransports) {
  auto world = MakeWorld(kInterleaved, Options(true, true, /*shm=*/false));
  ASSERT_NE(world, nullptr);
  world->Run([&](Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, 6));
    HierarchicalHostComm* h = AsHierarchical(set);
    EXPECT_NE(h, nullptr);
    if (!h) return;
    EXPECT_EQ(dynamic_cast<shm::ShmHostComm*>(&h->local()), nullptr);
    CheckAllreduce(*h, Range(0, 6), t.topology().rank, DataType::kFloat16, ReduceOp::kSum, 999);
    CheckAllgatherv(*h, 4001, "no shm");
  });
}

// Ranks that do not all ask for it: nobody uses it (and nobody waits for sub-groups).
TEST(HierarchicalHostComm, OnlyWhatEveryRankAsksFor) {
  auto world = MakeWorld(kThreeByTwo, [](int r) { return Options(r == 0, true); });
  ASSERT_NE(world, nullptr);
  world->Run([&](Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, 6));
    HierarchicalHostComm* h = AsHierarchical(set);
    EXPECT_NE(h, nullptr);
    if (!h) return;
    EXPECT_FALSE(h->hierarchical_allreduce());
    EXPECT_TRUE(h->hierarchical_allgather());
    CheckAllreduce(*h, Range(0, 6), t.topology().rank, DataType::kInt32, ReduceOp::kMin, 13);
  });
}

}  // namespace
}  // namespace hvdc

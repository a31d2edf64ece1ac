// The shared-memory data plane beyond the conformance suites: calls several times the segment
// (fp32/fp16/bf16, bitwise the same on every rank), a soak of random sizes with no barrier in
// between, when the plane is used and when it falls back, and the segments' names (refused when
// stale or foreign, gone from /dev/shm once the plane is up). Ranks as threads.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/cpu/kernels.h"
#include "shm_controller/shm_host_comm.h"
#include "shm_controller/shm_segment.h"
#include "shm_controller/shm_transport.h"
#include "tests/cpp/conformance/suite_util.h"
#include "tests/cpp/util/shm_world.h"

namespace hvdc {
namespace {

using conformance::MakeSet;
using conformance::Range;
using conformance::World;

constexpr int64_t kSegment = 64 * 1024;

shm::ShmOptions Options(int64_t bytes = kSegment) {
  shm::ShmOptions o;
  o.bytes = bytes;
  o.host = "one-host";
  return o;
}

bool InDevShm(const std::string& name) {
  struct stat st;
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

double Value(int rank, int64_t i) {
  return 0.25 * ((i * 7 + rank * 3) % 29) - 3.0 + 1.0 / (1 + rank);
}

// 3.5 segments of data, summed in place; every rank's bytes compared with every other's and the
// values with a double-precision reference.
void CheckLargeSum(int n, DataType dtype) {
  const int64_t es = static_cast<int64_t>(DataTypeSize(dtype));
  const int64_t count = kSegment * 7 / 2 / es + 1;
  std::vector<std::vector<uint8_t>> results(n);
  auto world = MakeShmWorld(n, Options());
  ASSERT_NE(world, nullptr);
  world->Run([&](Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    if (!set.data) return;
    EXPECT_NE(dynamic_cast<shm::ShmHostComm*>(set.data.get()), nullptr);
    const int r = set.data->rank();
    std::vector<uint8_t> buf(static_cast<size_t>(count * es));
    for (int64_t i = 0; i < count; ++i) {
      const float v = static_cast<float>(Value(r, i));
      if (dtype == DataType::kFloat32) {
        std::memcpy(buf.data() + i * es, &v, sizeof(v));
      } else {
        const uint16_t h =
            dtype == DataType::kFloat16 ? cpu::FloatToHalf(v) : cpu::FloatToBfloat16(v);
        std::memcpy(buf.data() + i * es, &h, sizeof(h));
      }
    }
    EXPECT_TRUE(set.data->Allreduce(buf.data(), buf.data(), count, dtype, ReduceOp::kSum).ok());
    results[r] = std::move(buf);
  });
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(results[r].size(), results[0].size());
    EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), results[0].size()), 0)
        << "rank " << r << " differs from rank 0";
  }
  const double tolerance = dtype == DataType::kFloat32   ? 1e-5
                           : dtype == DataType::kFloat16 ? 2e-2
                                                         : 0.2;
  int bad = 0;
  for (int64_t i = 0; i < count && !results[0].empty(); ++i) {
    double expected = 0;
    for (int r = 0; r < n; ++r) expected += Value(r, i);
    double got;
    if (dtype == DataType::kFloat32) {
      float f;
      std::memcpy(&f, results[0].data() + i * es, sizeof(f));
      got = f;
    } else {
      uint16_t h;
      std::memcpy(&h, results[0].data() + i * es, sizeof(h));
      got = dtype == DataType::kFloat16 ? cpu::HalfToFloat(h) : cpu::Bfloat16ToFloat(h);
    }
    if (std::fabs(got - expected) > tolerance * (1 + std::fabs(expected))) ++bad;
  }
  EXPECT_EQ(bad, 0) << DataTypeName(dtype) << " at np " << n;
}

TEST(ShmPlane, SumOfThreeAndAHalfSegmentsIsBitIdentical) {
  for (int n : {2, 3, 4}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, " + DataTypeName(dtype));
      CheckLargeSum(n, dtype);
    }
  }
}

// Back-to-back calls of random sizes (up to half a segment: several rounds at 3 ranks) and of every
// collective the plane implements, the same sequence on every rank, no barrier between them:
// exercises the reuse of both halves of every slot. Measured alone on 2 cores: 2 s in the plain
// build, 3 s under ASan, 12 s under TSan (which runs this suite; see scripts/test.sh).
TEST(ShmPlane, SoakOfRandomSizes) {
  const int n = 3;
  const int kOps = 10000;
  auto world = MakeShmWorld(n, Options());
  ASSERT_NE(world, nullptr);
  world->Run([&](Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    if (!set.data) return;
    HostComm& comm = *set.data;
    const int r = comm.rank();
    std::mt19937 rng(1234);  // the same on every rank
    int wrong = 0;
    for (int op = 0; op < kOps; ++op) {
      const int64_t count = std::uniform_int_distribution<int64_t>(0, kSegment / 8)(rng);
      const int kind = static_cast<int>(rng() % 6);
      if (kind == 0 || kind == 1) {  // allreduce, out of place or in place
        std::vector<int32_t> v(static_cast<size_t>(count)), out(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(i * (r + 1) + op);
        int32_t* dst = kind == 0 ? out.data() : v.data();
        if (!comm.Allreduce(v.data(), dst, count, DataType::kInt32, ReduceOp::kSum).ok()) ++wrong;
        for (int64_t i = 0; i < count; ++i) {
          if (dst[i] != static_cast<int32_t>(i * n * (n + 1) / 2 + n * op)) ++wrong;
        }
      } else if (kind == 2) {  // allgather, in place
        std::vector<int32_t> v(static_cast<size_t>(count * n));
        for (int64_t i = 0; i < count; ++i) v[r * count + i] = static_cast<int32_t>(r * 1000 + i);
        const int64_t bytes = count * 4;
        if (!comm.Allgatherv(v.data() + r * count, bytes, v.data(), std::vector<int64_t>(n, bytes))
                 .ok()) {
          ++wrong;
        }
        for (int q = 0; q < n; ++q) {
          for (int64_t i = 0; i < count; ++i) {
            if (v[q * count + i] != static_cast<int32_t>(q * 1000 + i)) ++wrong;
          }
        }
      } else if (kind == 3) {  // broadcast from a rotating root
        std::vector<int32_t> v(static_cast<size_t>(count));
        const int root = op % n;
        for (int64_t i = 0; i < count; ++i) v[i] = r == root ? static_cast<int32_t>(i ^ op) : -1;
        if (!comm.Broadcast(v.data(), count * 4, root).ok()) ++wrong;
        for (int64_t i = 0; i < count; ++i) {
          if (v[i] != static_cast<int32_t>(i ^ op)) ++wrong;
        }
      } else if (kind == 4) {  // reduce-scatter of `count` elements, blocks as even as they go
        std::vector<int64_t> counts(n);
        for (int q = 0; q < n; ++q) counts[q] = count / n + (q < count % n ? 1 : 0);
        int64_t first = 0;
        for (int q = 0; q < r; ++q) first += counts[q];
        std::vector<int32_t> v(static_cast<size_t>(count)), out(static_cast<size_t>(counts[r]));
        for (int64_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(i * (r + 1) - op);
        if (!comm.ReduceScatter(v.data(), out.data(), counts, DataType::kInt32, ReduceOp::kSum)
                 .ok()) {
          ++wrong;
        }
        for (int64_t j = 0; j < counts[r]; ++j) {
          if (out[j] != static_cast<int32_t>((first + j) * n * (n + 1) / 2 - n * op)) ++wrong;
        }
      } else {  // alltoallv: from rank s to rank d, Pair(s, d) elements (0 to count)
        auto pair = [&](int s, int d) { return (count + s * 13 + d * 7) % (count + 1); };
        auto value = [&](int s, int d, int64_t i) {
          return static_cast<int32_t>((s * 16 + d) * 65536 + i + op % 1000);
        };
        std::vector<int64_t> send_bytes(n), recv_bytes(n);
        std::vector<int32_t> send, recv;
        for (int q = 0; q < n; ++q) {
          send_bytes[q] = pair(r, q) * 4;
          recv_bytes[q] = pair(q, r) * 4;
          for (int64_t i = 0; i < pair(r, q); ++i) send.push_back(value(r, q, i));
        }
        recv.resize(static_cast<size_t>(count * n + 1));
        if (!comm.Alltoallv(send.data(), send_bytes, recv.data(), recv_bytes).ok()) ++wrong;
        int64_t at = 0;
        for (int q = 0; q < n; ++q) {
          for (int64_t i = 0; i < pair(q, r); ++i) {
            if (recv[at++] != value(q, r, i)) ++wrong;
          }
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "rank " << r;
  });
}

// Not used -- and everything still works through the transport's own data plane -- when turned
// off, when the segment is too small for the ranks, larger than /dev/shm, or the ranks are on
// different hosts.
TEST(ShmPlane, FallsBackWhenItCannotBeUsed) {
  const int n = 3;
  shm::ShmOptions off = Options();
  off.enabled = false;
  std::vector<std::pair<std::string, std::unique_ptr<World>>> worlds;
  worlds.emplace_back("HVDC_SHM=0", MakeShmWorld(n, off));
  worlds.emplace_back("tiny segment", MakeShmWorld(n, Options(512)));
  worlds.emplace_back("larger than /dev/shm", MakeShmWorld(n, Options(int64_t{1} << 40)));
  worlds.emplace_back("several hosts", MakeShmWorld(n, Options(), {"a", "a", "b"}));
  for (auto& [why, world] : worlds) {
    SCOPED_TRACE(why);
    ASSERT_NE(world, nullptr);
    world->Run([&](Transport& t) {
      ProcessSetChannels set = MakeSet(t, Range(0, n));
      ASSERT_NE(set.data, nullptr);
      EXPECT_EQ(dynamic_cast<shm::ShmHostComm*>(set.data.get()), nullptr);
      int32_t v = set.data->rank() + 1, sum = 0;
      EXPECT_TRUE(set.data->Allreduce(&v, &sum, 1, DataType::kInt32, ReduceOp::kSum).ok());
      EXPECT_EQ(sum, n * (n + 1) / 2);
    });
  }
}

// The names are gone from /dev/shm as soon as the plane is up: while it works, after a clean
// end, and after an exception unwinds through the comms.
TEST(ShmPlane, NothingLeftInDevShm) {
  const int n = 2;
  std::mutex mu;
  std::vector<std::string> names;
  auto world = MakeShmWorld(n, Options());
  ASSERT_NE(world, nullptr);
  world->Run([&](Transport& t) {
    try {
      ProcessSetChannels set = MakeSet(t, Range(0, n));
      auto* plane = dynamic_cast<shm::ShmHostComm*>(set.data.get());
      ASSERT_NE(plane, nullptr);
      EXPECT_FALSE(InDevShm(plane->segment_name())) << plane->segment_name();
      {
        std::lock_guard<std::mutex> lock(mu);
        names.push_back(plane->segment_name());
      }
      EXPECT_TRUE(set.data->Barrier().ok());
      throw std::runtime_error("leaving by an exception");
    } catch (const std::runtime_error&) {
    }
  });
  world.reset();
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0], names[1]);
  for (const std::string& name : names) EXPECT_FALSE(InDevShm(name)) << name;
}

TEST(ShmSegment, StaleOrForeignSegmentsAreRefused) {
  std::random_device rd;
  const uint64_t job = (static_cast<uint64_t>(rd()) << 32) | rd();
  const std::string name = shm::SegmentName(job, 0);
  const shm::SegmentSpec spec{job, 2, kSegment};
  std::unique_ptr<shm::Segment> first, second;
  ASSERT_TRUE(shm::Segment::Create(name, spec, &first).ok());
  // The same name again (a stale segment of a job id that came up twice): refused, not reused.
  Status again = shm::Segment::Create(name, spec, &second);
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("exists"), std::string::npos) << again.ToString();
  // Another job's, or another size or rank count: refused on attach.
  shm::SegmentSpec other_job = spec;
  other_job.job_id = job + 1;
  EXPECT_FALSE(shm::Segment::Attach(name, other_job, &second).ok());
  shm::SegmentSpec other_ranks = spec;
  other_ranks.nranks = 3;
  EXPECT_FALSE(shm::Segment::Attach(name, other_ranks, &second).ok());
  shm::SegmentSpec other_size = spec;
  other_size.bytes = 2 * kSegment;
  EXPECT_FALSE(shm::Segment::Attach(name, other_size, &second).ok());
  // Not a segment of ours at all.
  std::memset(first->base(), 0, 64);
  EXPECT_FALSE(shm::Segment::Attach(name, spec, &second).ok());
  shm::Segment::Unlink(name);
  EXPECT_FALSE(InDevShm(name));
  EXPECT_FALSE(shm::Segment::Attach(name, spec, &second).ok());
  EXPECT_EQ(second, nullptr);
}

}  // namespace
}  // namespace hvdc

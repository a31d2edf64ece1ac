// TcpHostComm over loopback, ranks as threads: every collective against values computed here,
// for world sizes 1-5, sizes 0, 1, odd, above a segment and above the small-message threshold,
// every dtype (float16/bfloat16 included) and reduce op.
#include "tcp_controller/tcp_host_comm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ops/cpu/kernels.h"
#include "tcp_controller/tcp_group.h"
#include "tcp_test_util.h"

namespace hvdc {
namespace {

using tcp::Group;
using tcp::TcpHostComm;
using tcp_test::RunRanks;

constexpr int64_t kSegment = 4096;  // small, so the ring cuts blocks into many segments

const DataType kTypes[] = {DataType::kUint8,   DataType::kInt8,    DataType::kUint16,
                           DataType::kInt16,   DataType::kInt32,   DataType::kInt64,
                           DataType::kFloat16, DataType::kFloat32, DataType::kFloat64,
                           DataType::kBool,    DataType::kBfloat16};

void Put(DataType t, void* p, int64_t i, double v) {
  switch (t) {
    case DataType::kUint8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case DataType::kInt8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      break;
    case DataType::kUint16:
      static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v);
      break;
    case DataType::kInt16:
      static_cast<int16_t*>(p)[i] = static_cast<int16_t>(v);
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(p)[i] = cpu::FloatToHalf(static_cast<float>(v));
      break;
    case DataType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      static_cast<double*>(p)[i] = v;
      break;
    case DataType::kBool:
      static_cast<bool*>(p)[i] = v != 0;
      break;
    case DataType::kBfloat16:
      static_cast<uint16_t*>(p)[i] = cpu::FloatToBfloat16(static_cast<float>(v));
      break;
  }
}

double Get(DataType t, const void* p, int64_t i) {
  switch (t) {
    case DataType::kUint8:
      return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt8:
      return static_cast<const int8_t*>(p)[i];
    case DataType::kUint16:
      return static_cast<const uint16_t*>(p)[i];
    case DataType::kInt16:
      return static_cast<const int16_t*>(p)[i];
    case DataType::kInt32:
      return static_cast<const int32_t*>(p)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::kFloat16:
      return cpu::HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(p)[i];
    case DataType::kBool:
      return static_cast<const bool*>(p)[i] ? 1 : 0;
    case DataType::kBfloat16:
      return cpu::Bfloat16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

// Inputs stay small integers so every dtype represents every partial result exactly.
double Input(DataType t, ReduceOp op, int rank, int64_t i) {
  if (t == DataType::kBool) return (rank + i) % 3 != 0;
  if (op == ReduceOp::kProduct) return 1 + (rank + i) % 2;
  return static_cast<double>((rank * 5 + i * 3) % 11) - (t == DataType::kInt8 ? 5 : 0);
}

double Expected(DataType t, ReduceOp op, int n, int64_t i) {
  double acc = Input(t, op, 0, i);
  for (int r = 1; r < n; ++r) {
    const double v = Input(t, op, r, i);
    if (t == DataType::kBool) {
      const bool any = op == ReduceOp::kSum || op == ReduceOp::kMax;
      acc = any ? (acc != 0 || v != 0) : (acc != 0 && v != 0);
    } else if (op == ReduceOp::kSum) {
      acc += v;
    } else if (op == ReduceOp::kMin) {
      acc = std::min(acc, v);
    } else if (op == ReduceOp::kMax) {
      acc = std::max(acc, v);
    } else {
      acc *= v;
    }
  }
  return acc;
}

std::vector<std::unique_ptr<TcpHostComm>> MakeComms(
    const std::vector<std::shared_ptr<tcp::Mesh>>& meshes) {
  const int n = static_cast<int>(meshes.size());
  std::vector<int> all(n);
  for (int r = 0; r < n; ++r) all[r] = r;
  std::vector<std::unique_ptr<TcpHostComm>> comms;
  for (int r = 0; r < n; ++r) {
    comms.push_back(std::make_unique<TcpHostComm>(Group(meshes[r], all, 7), kSegment));
  }
  return comms;
}

class TcpHostCommTest : public ::testing::TestWithParam<int> {};

TEST_P(TcpHostCommTest, AllreduceEveryDtypeAndOp) {
  const int n = GetParam();
  auto meshes = tcp_test::MakeMeshes(n);
  auto comms = MakeComms(meshes);
  // 70001 elements are above the small-message threshold even for 1-byte types: the ring runs.
  const int64_t counts[] = {0, 1, 2, 7, 1001, 70001};
  RunRanks(n, [&](int r) {
    TcpHostComm& comm = *comms[r];
    for (DataType t : kTypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
        for (int64_t count : counts) {
          if (op != ReduceOp::kSum && count != 7 && count != 70001) continue;
          const size_t esize = DataTypeSize(t);
          std::vector<uint8_t> in(count * esize + 1), out(count * esize + 1);
          for (int64_t i = 0; i < count; ++i) Put(t, in.data(), i, Input(t, op, r, i));
          const bool in_place = count % 2 == 1;
          Status s = comm.Allreduce(in.data(), in_place ? in.data() : out.data(), count, t, op);
          ASSERT_TRUE(s.ok()) << s.ToString();
          const uint8_t* res = in_place ? in.data() : out.data();
          for (int64_t i = 0; i < count; ++i) {
            ASSERT_EQ(Get(t, res, i), Expected(t, op, n, i))
                << "rank " << r << " " << DataTypeName(t) << " " << ReduceOpName(op) << " count "
                << count << " at " << i;
          }
        }
      }
    }
  });
}

TEST_P(TcpHostCommTest, FloatResultsAreBitIdenticalOnEveryRank) {
  const int n = GetParam();
  auto meshes = tcp_test::MakeMeshes(n);
  auto comms = MakeComms(meshes);
  std::vector<std::vector<float>> results(n);
  for (int64_t count : {int64_t{5}, int64_t{50001}}) {
    RunRanks(n, [&](int r) {
      std::vector<float> v(count);
      for (int64_t i = 0; i < count; ++i) v[i] = 1.0f / (1 + r + i % 13) + 1e-3f * r;
      ASSERT_TRUE(
          comms[r]->Allreduce(v.data(), v.data(), count, DataType::kFloat32, ReduceOp::kSum).ok());
      results[r] = v;
    });
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), count * sizeof(float)), 0)
          << "rank " << r << " count " << count;
    }
  }
}

TEST_P(TcpHostCommTest, ReduceScatterUnevenBlocks) {
  const int n = GetParam();
  auto meshes = tcp_test::MakeMeshes(n);
  auto comms = MakeComms(meshes);
  RunRanks(n, [&](int r) {
    for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16,
                       DataType::kInt32, DataType::kUint8}) {
      for (int64_t scale : {0, 1, 3000}) {
        std::vector<int64_t> counts(n);
        for (int b = 0; b < n; ++b) counts[b] = (b % 3) * scale + (b == 1 ? 0 : 1);
        int64_t total = 0;
        for (int64_t c : counts) total += c;
        const size_t esize = DataTypeSize(t);
        std::vector<uint8_t> in(total * esize + 1), out(counts[r] * esize + 1);
        for (int64_t i = 0; i < total; ++i) Put(t, in.data(), i, Input(t, ReduceOp::kSum, r, i));
        Status s = comms[r]->ReduceScatter(in.data(), out.data(), counts, t, ReduceOp::kSum);
        ASSERT_TRUE(s.ok()) << s.ToString();
        int64_t off = 0;
        for (int b = 0; b < r; ++b) off += counts[b];
        for (int64_t i = 0; i < counts[r]; ++i) {
          ASSERT_EQ(Get(t, out.data(), i), Expected(t, ReduceOp::kSum, n, off + i))
              << "rank " << r << " " << DataTypeName(t) << " at " << i;
        }
      }
    }
  });
}

uint8_t Byte(int rank, int64_t i) { return static_cast<uint8_t>(rank * 37 + i * 11 + 5); }

TEST_P(TcpHostCommTest, AllgathervUneven) {
  const int n = GetParam();
  auto meshes = tcp_test::MakeMeshes(n);
  auto comms = MakeComms(meshes);
  RunRanks(n, [&](int r) {
    for (int64_t big : {int64_t{0}, int64_t{1}, int64_t{100003}}) {
      std::vector<int64_t> sizes(n);
      for (int q = 0; q < n; ++q) sizes[q] = q % 2 == 0 ? big + q : q - 1;  // rank 1 sends 0
      int64_t total = 0;
      for (int64_t b : sizes) total += b;
      std::vector<uint8_t> mine(sizes[r]), out(total + 1, 0xEE);
      for (int64_t i = 0; i < sizes[r]; ++i) mine[i] = Byte(r, i);
      Status s = comms[r]->Allgatherv(mine.data(), sizes[r], out.data(), sizes);
      ASSERT_TRUE(s.ok()) << s.ToString();
      int64_t off = 0;
      for (int q = 0; q < n; ++q) {
        for (int64_t i = 0; i < sizes[q]; ++i) ASSERT_EQ(out[off + i], Byte(q, i)) << q << " " << i;
        off += sizes[q];
      }
      EXPECT_EQ(out[total], 0xEE);
    }
  });
}

TEST_P(TcpHostCommTest, BroadcastFromEveryRoot) {
  const int n = GetParam();
  auto meshes = tcp_test::MakeMeshes(n);
  auto comms = MakeComms(meshes);
  RunRanks(n, [&](int r) {
    for (int root = 0; root < n; ++root) {
      for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{999}, int64_t{200001}}) {
        std::vector<uint8_t> buf(bytes);
        for (int64_t i = 0; i < bytes; ++i) buf[i] = r == root ? Byte(root, i) : 0;
        Status s = comms[r]->Broadcast(buf.data(), bytes, root);
        ASSERT_TRUE(s.ok()) << s.ToString();
        for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(buf[i], Byte(root, i)) << root << " " << i;
      }
    }
  });
}

TEST_P(TcpHostCommTest, AlltoallvSplits) {
  const int n = GetParam();
  auto meshes = tcp_test::MakeMeshes(n);
  auto comms = MakeComms(meshes);
  // Rank a sends rank b split(a, b) bytes, each byte tagged with (a, b, index).
  auto split = [](int a, int b, int64_t scale) { return ((a + 2 * b) % 3) * scale + (a == b); };
  auto tag = [](int a, int b, int64_t i) { return static_cast<uint8_t>(a * 59 + b * 17 + i); };
  RunRanks(n, [&](int r) {
    for (int64_t scale : {int64_t{0}, int64_t{5}, int64_t{70000}}) {
      std::vector<int64_t> send(n), recv(n);
      for (int q = 0; q < n; ++q) {
        send[q] = split(r, q, scale);
        recv[q] = split(q, r, scale);
      }
      std::vector<uint8_t> in;
      for (int q = 0; q < n; ++q) {
        for (int64_t i = 0; i < send[q]; ++i) in.push_back(tag(r, q, i));
      }
      int64_t total = 0;
      for (int64_t b : recv) total += b;
      std::vector<uint8_t> out(total + 1);
      Status s = comms[r]->Alltoallv(in.data(), send, out.data(), recv);
      ASSERT_TRUE(s.ok()) << s.ToString();
      int64_t off = 0;
      for (int q = 0; q < n; ++q) {
        for (int64_t i = 0; i < recv[q]; ++i) ASSERT_EQ(out[off + i], tag(q, r, i));
        off += recv[q];
      }
    }
  });
}

TEST_P(TcpHostCommTest, BarrierAndBadArguments) {
  const int n = GetParam();
  auto meshes = tcp_test::MakeMeshes(n);
  auto comms = MakeComms(meshes);
  RunRanks(n, [&](int r) {
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(comms[r]->Barrier().ok());
    // Checked locally, before anything is sent: every rank gets the same error.
    EXPECT_EQ(comms[r]->Broadcast(nullptr, 1, n).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(comms[r]->Allreduce(nullptr, nullptr, -1, DataType::kFloat32, ReduceOp::kSum).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(comms[r]->Allgatherv(nullptr, 0, nullptr, std::vector<int64_t>(n + 1, 0)).code(),
              StatusCode::kInvalidArgument);
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, TcpHostCommTest, ::testing::Values(1, 2, 3, 4, 5));

TEST(TcpHostComm, PeerGoneMidOperationNamesIt) {
  auto meshes = tcp_test::MakeMeshes(3);
  auto comms = MakeComms(meshes);
  meshes[2]->Close();  // rank 2's process ends before the collective
  std::vector<float> v(100000, 1.0f);
  // Rank 0's ring receives from rank 2 (its left neighbour).
  Status s = comms[0]->Allreduce(v.data(), v.data(), 100000, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kUnknownError);
  EXPECT_NE(s.message().find("rank 2 (127.0.0.1:"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace hvdc

// The in-memory world: N ranks as N threads. Every control-channel operation and every HostComm
// primitive over worlds of 1..8 ranks, with inputs f(rank, index) and expected values computed;
// process sets (overlapping, disjoint, singletons); mismatches and missing ranks as errors.
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
#include "ops/cpu/kernels.h"
#include "local_controller/local_channel.h"
#include "local_controller/local_host_comm.h"

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

uint64_t BitWord(int rank, int iter, size_t w) {
  // Every bit is cleared by exactly one (rank, word) pattern, so the AND is easy to state.
  return ~(uint64_t{1} << ((rank * 7 + iter * 3 + w) % 64));
}

TEST_P(LocalWorldTest, ControlBitAnd) {
  const int n = GetParam();
  std::vector<ProcessSetChannels> kept(n);
  RunRanks(n, [n, &kept](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    ASSERT_NE(set.control, nullptr);
    EXPECT_EQ(set.control->rank(), rank);
    EXPECT_EQ(set.control->size(), n);
    for (int iter = 0; iter < 40; ++iter) {
      const size_t len = (iter % 5 == 0) ? 0 : static_cast<size_t>(iter % 7) + 1;
      std::vector<uint64_t> bits(len);
      for (size_t w = 0; w < len; ++w) bits[w] = BitWord(rank, iter, w);
      Status s = Wait(set.control->StartBitAnd(&bits));
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(bits.size(), len);
      for (size_t w = 0; w < len; ++w) {
        uint64_t expected = ~uint64_t{0};
        for (int r = 0; r < n; ++r) expected &= BitWord(r, iter, w);
        EXPECT_EQ(bits[w], expected) << "iter " << iter << " word " << w;
      }
    }
    kept[rank] = std::move(set);
  });
  for (ProcessSetChannels& set : kept) ExpectNoSlots(set);
}

std::string Blob(int rank, int iter) {
  const int len = (rank * 5 + iter * 3) % 17 == 0 ? 0 : (rank * 131 + iter * 17) % 300;
  std::string s(static_cast<size_t>(len), '\0');
  for (int i = 0; i < len; ++i) s[i] = static_cast<char>((rank * 31 + iter * 7 + i) & 0xff);
  return s;
}

TEST_P(LocalWorldTest, ControlGather) {
  const int n = GetParam();
  std::vector<ProcessSetChannels> kept(n);
  RunRanks(n, [n, &kept](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    for (int iter = 0; iter < 40; ++iter) {
      std::vector<std::string> gathered = {"stale"};
      Status s = Wait(set.control->StartGather(Blob(rank, iter), &gathered));
      ASSERT_TRUE(s.ok()) << s.ToString();
      if (rank == 0) {
        ASSERT_EQ(static_cast<int>(gathered.size()), n);
        for (int r = 0; r < n; ++r) EXPECT_EQ(gathered[r], Blob(r, iter)) << r << " " << iter;
      } else {
        EXPECT_TRUE(gathered.empty());
      }
    }
    kept[rank] = std::move(set);
  });
  for (ProcessSetChannels& set : kept) ExpectNoSlots(set);
}

TEST_P(LocalWorldTest, ControlBroadcast) {
  const int n = GetParam();
  std::vector<ProcessSetChannels> kept(n);
  RunRanks(n, [n, &kept](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    for (int iter = 0; iter < 40; ++iter) {
      std::string blob = rank == 0 ? Blob(3, iter) : std::string(static_cast<size_t>(rank), 'x');
      Status s = Wait(set.control->StartBroadcast(&blob));
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(blob, Blob(3, iter)) << iter;
    }
    // Large blob.
    std::string big = rank == 0 ? std::string(1 << 20, 'q') : std::string();
    ASSERT_TRUE(Wait(set.control->StartBroadcast(&big)).ok());
    EXPECT_EQ(big, std::string(1 << 20, 'q'));
    kept[rank] = std::move(set);
  });
  for (ProcessSetChannels& set : kept) ExpectNoSlots(set);
}

TEST_P(LocalWorldTest, ControlMixedSequence) {
  const int n = GetParam();
  RunRanks(n, [n](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    for (int iter = 0; iter < 30; ++iter) {
      std::vector<uint64_t> bits = {BitWord(rank, iter, 0), ~uint64_t{0}};
      ASSERT_TRUE(Wait(set.control->StartBitAnd(&bits)).ok());
      uint64_t expected = ~uint64_t{0};
      for (int r = 0; r < n; ++r) expected &= BitWord(r, iter, 0);
      EXPECT_EQ(bits[0], expected);
      EXPECT_EQ(bits[1], ~uint64_t{0});
      std::vector<std::string> gathered;
      ASSERT_TRUE(Wait(set.control->StartGather(Blob(rank, iter), &gathered)).ok());
      std::string reply;
      if (rank == 0) {
        for (const std::string& g : gathered) reply += g;
      }
      ASSERT_TRUE(Wait(set.control->StartBroadcast(&reply)).ok());
      std::string want;
      for (int r = 0; r < n; ++r) want += Blob(r, iter);
      EXPECT_EQ(reply, want);
    }
  });
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

// ---- data plane ----

template <typename T>
T FromDouble(double v) {
  return static_cast<T>(v);
}
template <typename T>
double ToDouble(T v) {
  return static_cast<double>(v);
}

struct Half {
  uint16_t bits;
};
struct Bf16 {
  uint16_t bits;
};
template <>
Half FromDouble<Half>(double v) {
  return Half{cpu::FloatToHalf(static_cast<float>(v))};
}
template <>
double ToDouble<Half>(Half v) {
  return cpu::HalfToFloat(v.bits);
}
template <>
Bf16 FromDouble<Bf16>(double v) {
  return Bf16{cpu::FloatToBfloat16(static_cast<float>(v))};
}
template <>
double ToDouble<Bf16>(Bf16 v) {
  return cpu::Bfloat16ToFloat(v.bits);
}

// Small positive values whose sums and products (up to 8 ranks) are exact in every type.
double Input(int rank, int64_t i, ReduceOp op, DataType dtype) {
  if (dtype == DataType::kBool) return (rank + i) % 3 != 0 ? 1 : 0;
  if (op == ReduceOp::kProduct) return static_cast<double>((rank + i) % 2 + 1);
  return static_cast<double>((rank * 3 + i) % 5 + 1);
}

double Expected(int n, int64_t i, ReduceOp op, DataType dtype) {
  double acc = Input(0, i, op, dtype);
  for (int r = 1; r < n; ++r) {
    double v = Input(r, i, op, dtype);
    switch (op) {
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kProduct:
        acc = dtype == DataType::kBool ? (acc != 0 && v != 0) : acc * v;
        break;
      default:
        acc = dtype == DataType::kBool ? (acc != 0 || v != 0) : acc + v;
        break;
    }
  }
  if (dtype == DataType::kUint8) acc = static_cast<double>(static_cast<uint8_t>(acc));
  return acc;
}

template <typename T>
void CheckAllreduce(HostComm& comm, int rank, int n, DataType dtype, ReduceOp op, int64_t count,
                    bool in_place) {
  std::vector<T> send(static_cast<size_t>(count)), recv(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) send[i] = FromDouble<T>(Input(rank, i, op, dtype));
  if (in_place) recv = send;
  Status s = comm.Allreduce(in_place ? recv.data() : send.data(), recv.data(), count, dtype, op);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(ToDouble(recv[i]), Expected(n, i, op, dtype))
        << DataTypeName(dtype) << " " << ReduceOpName(op) << " count " << count << " i " << i;
  }
  if (!in_place) {
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(ToDouble(send[i]), ToDouble(FromDouble<T>(Input(rank, i, op, dtype))));
    }
  }
}

TEST_P(LocalWorldTest, Allreduce) {
  const int n = GetParam();
  std::vector<ProcessSetChannels> kept(n);
  RunRanks(n, [n, &kept](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    HostComm& comm = *set.data;
    EXPECT_EQ(comm.rank(), rank);
    EXPECT_EQ(comm.size(), n);
    for (int64_t count : {0, 1, 5, 64, 1001, 100003}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
        for (bool in_place : {false, true}) {
          CheckAllreduce<float>(comm, rank, n, DataType::kFloat32, op, count, in_place);
          if (count > 2000) continue;
          CheckAllreduce<double>(comm, rank, n, DataType::kFloat64, op, count, in_place);
          CheckAllreduce<int32_t>(comm, rank, n, DataType::kInt32, op, count, in_place);
          CheckAllreduce<int64_t>(comm, rank, n, DataType::kInt64, op, count, in_place);
          CheckAllreduce<uint8_t>(comm, rank, n, DataType::kUint8, op, count, in_place);
          CheckAllreduce<Half>(comm, rank, n, DataType::kFloat16, op, count, in_place);
          CheckAllreduce<Bf16>(comm, rank, n, DataType::kBfloat16, op, count, in_place);
          CheckAllreduce<uint8_t>(comm, rank, n, DataType::kBool, op, count, in_place);
        }
      }
    }
    kept[rank] = std::move(set);
  });
  for (ProcessSetChannels& set : kept) ExpectNoSlots(set);
}

uint8_t Byte(int a, int b, int64_t i) { return static_cast<uint8_t>((a * 31 + b * 7 + i) & 0xff); }

TEST_P(LocalWorldTest, Allgatherv) {
  const int n = GetParam();
  RunRanks(n, [n](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    auto bytes_of = [](int r, int iter) -> int64_t {
      return (r + iter) % 4 == 0 ? 0 : (r * 13 + iter * 5) % 97 + 1;
    };
    for (int iter = 0; iter < 20; ++iter) {
      for (bool in_place : {false, true}) {
        std::vector<int64_t> recv_bytes(n);
        int64_t total = 0, my_offset = 0;
        for (int r = 0; r < n; ++r) {
          recv_bytes[r] = bytes_of(r, iter);
          if (r == rank) my_offset = total;
          total += recv_bytes[r];
        }
        std::vector<uint8_t> send(static_cast<size_t>(bytes_of(rank, iter)));
        for (size_t i = 0; i < send.size(); ++i) send[i] = Byte(rank, iter, i);
        std::vector<uint8_t> recv(static_cast<size_t>(total), 0xee);
        const uint8_t* src = send.data();
        if (in_place) {
          std::copy(send.begin(), send.end(), recv.begin() + my_offset);
          src = recv.data() + my_offset;
        }
        Status s =
            set.data->Allgatherv(src, static_cast<int64_t>(send.size()), recv.data(), recv_bytes);
        ASSERT_TRUE(s.ok()) << s.ToString();
        int64_t offset = 0;
        for (int r = 0; r < n; ++r) {
          for (int64_t i = 0; i < recv_bytes[r]; ++i) {
            ASSERT_EQ(recv[offset + i], Byte(r, iter, i)) << "from " << r << " iter " << iter;
          }
          offset += recv_bytes[r];
        }
      }
    }
  });
}

TEST_P(LocalWorldTest, Broadcast) {
  const int n = GetParam();
  RunRanks(n, [n](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    for (int root = 0; root < n; ++root) {
      for (int64_t bytes : {0, 1, 999, 1 << 16}) {
        std::vector<uint8_t> buf(static_cast<size_t>(bytes));
        for (int64_t i = 0; i < bytes; ++i) buf[i] = rank == root ? Byte(root, 1, i) : 0x5a;
        Status s = set.data->Broadcast(buf.data(), bytes, root);
        ASSERT_TRUE(s.ok()) << s.ToString();
        for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(buf[i], Byte(root, 1, i)) << root;
      }
    }
  });
}

TEST_P(LocalWorldTest, Alltoallv) {
  const int n = GetParam();
  RunRanks(n, [n](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    // Bytes rank `from` sends to rank `to` in iteration `iter`.
    auto amount = [](int from, int to, int iter) -> int64_t {
      return (from + 2 * to + iter) % 5 == 0 ? 0 : (from * 3 + to * 5 + iter) % 23 + 1;
    };
    for (int iter = 0; iter < 20; ++iter) {
      std::vector<int64_t> send_bytes(n), recv_bytes(n);
      std::vector<uint8_t> send;
      for (int to = 0; to < n; ++to) {
        send_bytes[to] = amount(rank, to, iter);
        recv_bytes[to] = amount(to, rank, iter);
        for (int64_t i = 0; i < send_bytes[to]; ++i) send.push_back(Byte(rank * 8 + to, iter, i));
      }
      int64_t total = 0;
      for (int64_t b : recv_bytes) total += b;
      std::vector<uint8_t> recv(static_cast<size_t>(total), 0xee);
      Status s = set.data->Alltoallv(send.data(), send_bytes, recv.data(), recv_bytes);
      ASSERT_TRUE(s.ok()) << s.ToString();
      int64_t offset = 0;
      for (int from = 0; from < n; ++from) {
        for (int64_t i = 0; i < recv_bytes[from]; ++i) {
          ASSERT_EQ(recv[offset + i], Byte(from * 8 + rank, iter, i)) << from << " " << iter;
        }
        offset += recv_bytes[from];
      }
    }
  });
}

TEST_P(LocalWorldTest, ReduceScatter) {
  const int n = GetParam();
  RunRanks(n, [n](int rank, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    for (int iter = 0; iter < 12; ++iter) {
      for (bool in_place : {false, true}) {
        std::vector<int64_t> counts(n);
        int64_t total = 0, my_offset = 0;
        for (int r = 0; r < n; ++r) {
          counts[r] = (r + iter) % 3 == 0 ? 0 : (r * 7 + iter * 11) % 50 + 1;
          if (r == rank) my_offset = total;
          total += counts[r];
        }
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          std::vector<float> send(static_cast<size_t>(total));
          for (int64_t i = 0; i < total; ++i) {
            send[i] = static_cast<float>(Input(rank, i, op, DataType::kFloat32));
          }
          std::vector<float> out(static_cast<size_t>(counts[rank]), -1.0f);
          float* recv = in_place ? send.data() : out.data();
          Status s = set.data->ReduceScatter(send.data(), recv, counts, DataType::kFloat32, op);
          ASSERT_TRUE(s.ok()) << s.ToString();
          for (int64_t i = 0; i < counts[rank]; ++i) {
            ASSERT_EQ(recv[i], Expected(n, my_offset + i, op, DataType::kFloat32))
                << "iter " << iter << " i " << i;
          }
        }
      }
    }
  });
}

TEST_P(LocalWorldTest, Barrier) {
  const int n = GetParam();
  std::atomic<int> arrived{0};
  RunRanks(n, [n, &arrived](int, Transport& t) {
    ProcessSetChannels set = MakeSet(t, Range(0, n));
    for (int iter = 0; iter < 50; ++iter) {
      arrived.fetch_add(1);
      ASSERT_TRUE(set.data->Barrier().ok());
      EXPECT_GE(arrived.load(), n * (iter + 1));
    }
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

// ---- process sets and agreement ----

TEST_P(LocalWorldTest, OverlappingProcessSets) {
  const int n = GetParam();
  const std::vector<std::vector<int>> sets = {
      Range(0, n),            // everyone
      Range(0, (n + 1) / 2),  // first half
      Range(n / 2, n),        // second half (overlaps the first when n is odd)
      {n - 1},                // a singleton
      [n] {                   // the even ranks
        std::vector<int> v;
        for (int r = 0; r < n; r += 2) v.push_back(r);
        return v;
      }(),
  };
  RunRanks(n, [&sets](int rank, Transport& t) {
    std::vector<ProcessSetChannels> channels(sets.size());
    std::vector<int> mine;
    for (size_t k = 0; k < sets.size(); ++k) {
      channels[k] = MakeSet(t, sets[k]);
      const bool member = std::find(sets[k].begin(), sets[k].end(), rank) != sets[k].end();
      EXPECT_EQ(channels[k].control != nullptr, member) << k;
      EXPECT_EQ(channels[k].data != nullptr, member) << k;
      if (!member) continue;
      mine.push_back(static_cast<int>(k));
      const int index =
          static_cast<int>(std::find(sets[k].begin(), sets[k].end(), rank) - sets[k].begin());
      EXPECT_EQ(channels[k].control->rank(), index);
      EXPECT_EQ(channels[k].control->size(), static_cast<int>(sets[k].size()));
      EXPECT_EQ(channels[k].data->rank(), index);
      EXPECT_EQ(channels[k].data->size(), static_cast<int>(sets[k].size()));
    }
    for (int iter = 0; iter < 10; ++iter) {
      // Control: one operation outstanding on every set of this rank at once, progressed together.
      std::vector<std::vector<uint64_t>> bits(sets.size());
      std::vector<std::unique_ptr<PendingOp>> ops;
      for (int k : mine) {
        bits[k] = {~(uint64_t{1} << rank), static_cast<uint64_t>(iter)};
        ops.push_back(channels[k].control->StartBitAnd(&bits[k]));
      }
      std::vector<bool> done(ops.size(), false);
      for (size_t remaining = ops.size(); remaining > 0;) {
        for (size_t i = 0; i < ops.size(); ++i) {
          Status s;
          if (!done[i] && ops[i]->Test(&s)) {
            ASSERT_TRUE(s.ok()) << s.ToString();
            done[i] = true;
            --remaining;
          }
        }
        std::this_thread::yield();
      }
      for (int k : mine) {
        uint64_t expected = ~uint64_t{0};
        for (int r : sets[k]) expected &= ~(uint64_t{1} << r);
        EXPECT_EQ(bits[k][0], expected) << "set " << k;
        EXPECT_EQ(bits[k][1], static_cast<uint64_t>(iter));
      }
      // Data: sets in ascending order on every rank, so overlapping sets cannot deadlock.
      for (int k : mine) {
        std::vector<int64_t> v = {rank, 1, iter};
        Status s =
            channels[k].data->Allreduce(v.data(), v.data(), 3, DataType::kInt64, ReduceOp::kSum);
        ASSERT_TRUE(s.ok()) << s.ToString();
        int64_t rank_sum = 0;
        for (int r : sets[k]) rank_sum += r;
        EXPECT_EQ(v[0], rank_sum);
        EXPECT_EQ(v[1], static_cast<int64_t>(sets[k].size()));
        EXPECT_EQ(v[2], static_cast<int64_t>(iter) * static_cast<int64_t>(sets[k].size()));
      }
    }
  });
}

TEST_P(LocalWorldTest, ProcessSetListsMustAgree) {
  const int n = GetParam();
  RunRanks(n, [n](int rank, Transport& t) {
    ProcessSetChannels channels;
    if (n > 1) {
      std::vector<int> ranks = rank == 1 ? Range(0, 1) : Range(0, n);
      Status s = t.CreateProcessSet(ranks, &channels);
      EXPECT_EQ(s.code(), StatusCode::kPreconditionError) << s.ToString();
      EXPECT_EQ(channels.control, nullptr);
    }
    for (const std::vector<int>& bad :
         {std::vector<int>{}, std::vector<int>{0, 0}, std::vector<int>{n}, std::vector<int>{-1}}) {
      Status s = t.CreateProcessSet(bad, &channels);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      EXPECT_EQ(channels.control, nullptr);
      EXPECT_EQ(channels.data, nullptr);
    }
    if (n > 1) {
      Status s = t.CreateProcessSet({1, 0}, &channels);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    }
    // Still in step: a good set works afterwards.
    channels = MakeSet(t, Range(0, n));
    ASSERT_NE(channels.data, nullptr);
    EXPECT_TRUE(channels.data->Barrier().ok());
  });
}

TEST_P(LocalWorldTest, CheckAgreement) {
  const int n = GetParam();
  RunRanks(n, [n](int rank, Transport& t) {
    for (int iter = 0; iter < 10; ++iter) {
      bool equal = false;
      ASSERT_TRUE(t.CheckAgreement(0xabcdef00ull + iter, &equal).ok());
      EXPECT_TRUE(equal);
      ASSERT_TRUE(t.CheckAgreement(rank == n - 1 ? 7 : 8, &equal).ok());
      EXPECT_EQ(equal, n == 1);
      ASSERT_TRUE(t.CheckAgreement(rank == 0 ? ~uint64_t{0} : 0, &equal).ok());
      EXPECT_EQ(equal, n == 1);
    }
  });
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

TEST(LocalWorld, SizeOneCompletesAtOnce) {
  std::unique_ptr<Transport> t = MakeLocalTransport(LocalWorld::Create(1), 0);
  ProcessSetChannels set = MakeSet(*t, {0});
  Status s;
  std::vector<uint64_t> bits = {5};
  EXPECT_TRUE(set.control->StartBitAnd(&bits)->Test(&s));
  EXPECT_EQ(bits[0], 5u);
  std::vector<std::string> gathered;
  EXPECT_TRUE(set.control->StartGather("abc", &gathered)->Test(&s));
  EXPECT_EQ(gathered, std::vector<std::string>{"abc"});
  std::string blob = "keep";
  EXPECT_TRUE(set.control->StartBroadcast(&blob)->Test(&s));
  EXPECT_EQ(blob, "keep");
  std::vector<double> a = {1, 2, 3}, b(3);
  ASSERT_TRUE(set.data->Allreduce(a.data(), b.data(), 3, DataType::kFloat64, ReduceOp::kSum).ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(set.data->Broadcast(a.data(), 8, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(set.data->Allreduce(a.data(), b.data(), -1, DataType::kFloat64, ReduceOp::kSum).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      set.data->Allreduce(a.data(), b.data(), 3, DataType::kFloat64, ReduceOp::kAdasum).code(),
      StatusCode::kInvalidArgument);
  EXPECT_TRUE(set.data->Barrier().ok());
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

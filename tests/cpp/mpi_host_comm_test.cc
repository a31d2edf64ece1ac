// MpiHostComm under mpirun (np 2 and 3): every primitive, each dtype and reduce op, sizes 0, 1,
// odd and large, in place and not, and with a small per-call limit so that the chunked paths run.
// Inputs are a function of (rank, index); expected values are computed here, over all ranks.
// Float inputs are chosen so that every reduction is exact in any order (small multiples of 1/4
// for sums, powers of two for products), so results are compared bit for bit.
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
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/types.h"
#include "ops/cpu/kernels.h"

namespace hvdc {
namespace {

int g_rank = 0;
int g_size = 1;
bool g_thread_multiple = false;

std::unique_ptr<HostComm> NewComm(int64_t max_per_call = INT_MAX) {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  return MakeMpiHostComm(dup, max_per_call);
}

const DataType kAllTypes[] = {DataType::kUint8,   DataType::kInt8,    DataType::kUint16,
                              DataType::kInt16,   DataType::kInt32,   DataType::kInt64,
                              DataType::kFloat16, DataType::kFloat32, DataType::kFloat64,
                              DataType::kBool,    DataType::kBfloat16};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct,
                            ReduceOp::kAverage};

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One element, as an integer (integer types and bool) or a real (float types).
struct Elem {
  int64_t i = 0;
  double r = 0;
};

bool IsInteger(DataType t) { return !IsFloatingPoint(t); }

// Wraps v to t's width: the value an element of type t holds.
int64_t Wrap(DataType t, uint64_t v) {
  switch (t) {
    case DataType::kUint8:
      return static_cast<uint8_t>(v);
    case DataType::kInt8:
      return static_cast<int8_t>(v);
    case DataType::kUint16:
      return static_cast<uint16_t>(v);
    case DataType::kInt16:
      return static_cast<int16_t>(v);
    case DataType::kInt32:
      return static_cast<int32_t>(v);
    case DataType::kBool:
      return v != 0;
    default:
      return static_cast<int64_t>(v);
  }
}

Elem Input(DataType t, ReduceOp op, int rank, int64_t index) {
  const uint64_t h = Mix(static_cast<uint64_t>(rank) * 0x100000001ull +
                         static_cast<uint64_t>(index) + (static_cast<uint64_t>(t) << 56));
  Elem e;
  if (t == DataType::kBool) {
    e.i = (h % 4) != 0;  // mostly true, so that "and" over ranks is sometimes true
  } else if (IsInteger(t)) {
    e.i = Wrap(t, h);  // full range: sums and products wrap
  } else if (op == ReduceOp::kProduct) {
    static const double kPowers[] = {0.25, 0.5, 1, 2, 4, -0.5, -1, -2};
    e.r = kPowers[h % 8];
  } else {
    e.r = (static_cast<int64_t>(h % 33) - 16) / 4.0;  // sums of up to 8 stay exact in bfloat16
  }
  return e;
}

Elem Combine(DataType t, ReduceOp op, Elem a, Elem b) {
  Elem e;
  if (t == DataType::kBool) {
    const bool all = op == ReduceOp::kMin || op == ReduceOp::kProduct;
    e.i = all ? (a.i && b.i) : (a.i || b.i);
  } else if (IsInteger(t)) {
    const uint64_t x = static_cast<uint64_t>(a.i), y = static_cast<uint64_t>(b.i);
    switch (op) {
      case ReduceOp::kMin:
        e.i = std::min(a.i, b.i);
        break;
      case ReduceOp::kMax:
        e.i = std::max(a.i, b.i);
        break;
      case ReduceOp::kProduct:
        e.i = Wrap(t, x * y);
        break;
      default:
        e.i = Wrap(t, x + y);
        break;
    }
  } else {
    switch (op) {
      case ReduceOp::kMin:
        e.r = std::min(a.r, b.r);
        break;
      case ReduceOp::kMax:
        e.r = std::max(a.r, b.r);
        break;
      case ReduceOp::kProduct:
        e.r = a.r * b.r;
        break;
      default:
        e.r = a.r + b.r;
        break;
    }
  }
  return e;
}

Elem Expected(DataType t, ReduceOp op, int64_t index) {
  Elem e = Input(t, op, 0, index);
  for (int r = 1; r < g_size; ++r) e = Combine(t, op, e, Input(t, op, r, index));
  return e;
}

void Write(DataType t, void* buf, int64_t index, Elem e) {
  char* p = static_cast<char*>(buf) + index * static_cast<int64_t>(DataTypeSize(t));
  auto put = [p](auto v) { std::memcpy(p, &v, sizeof(v)); };
  switch (t) {
    case DataType::kUint8:
      return put(static_cast<uint8_t>(e.i));
    case DataType::kInt8:
      return put(static_cast<int8_t>(e.i));
    case DataType::kUint16:
      return put(static_cast<uint16_t>(e.i));
    case DataType::kInt16:
      return put(static_cast<int16_t>(e.i));
    case DataType::kInt32:
      return put(static_cast<int32_t>(e.i));
    case DataType::kInt64:
      return put(static_cast<int64_t>(e.i));
    case DataType::kBool:
      return put(static_cast<uint8_t>(e.i));
    case DataType::kFloat16:
      return put(cpu::FloatToHalf(static_cast<float>(e.r)));  // exact for our inputs
    case DataType::kBfloat16:
      return put(cpu::FloatToBfloat16(static_cast<float>(e.r)));
    case DataType::kFloat32:
      return put(static_cast<float>(e.r));
    case DataType::kFloat64:
      return put(e.r);
  }
}

Elem Read(DataType t, const void* buf, int64_t index) {
  const char* p = static_cast<const char*>(buf) + index * static_cast<int64_t>(DataTypeSize(t));
  auto get = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  Elem e;
  switch (t) {
    case DataType::kUint8:
      e.i = get(uint8_t{});
      break;
    case DataType::kInt8:
      e.i = get(int8_t{});
      break;
    case DataType::kUint16:
      e.i = get(uint16_t{});
      break;
    case DataType::kInt16:
      e.i = get(int16_t{});
      break;
    case DataType::kInt32:
      e.i = get(int32_t{});
      break;
    case DataType::kInt64:
      e.i = get(int64_t{});
      break;
    case DataType::kBool:
      e.i = get(uint8_t{});
      break;
    case DataType::kFloat16:
      e.r = cpu::HalfToFloat(get(uint16_t{}));
      break;
    case DataType::kBfloat16:
      e.r = cpu::Bfloat16ToFloat(get(uint16_t{}));
      break;
    case DataType::kFloat32:
      e.r = get(float{});
      break;
    case DataType::kFloat64:
      e.r = get(double{});
      break;
  }
  return e;
}

std::vector<uint8_t> MakeInputs(DataType t, ReduceOp op, int64_t n, int64_t first_index = 0) {
  std::vector<uint8_t> buf(static_cast<size_t>(n) * DataTypeSize(t));
  for (int64_t i = 0; i < n; ++i) Write(t, buf.data(), i, Input(t, op, g_rank, first_index + i));
  return buf;
}

// Checks recv[0..n) against the reduction of elements first_index.. over all ranks; reports the
// first mismatch only.
void CheckReduced(DataType t, ReduceOp op, const void* recv, int64_t n, int64_t first_index) {
  for (int64_t i = 0; i < n; ++i) {
    const Elem want = Expected(t, op, first_index + i);
    const Elem got = Read(t, recv, i);
    const bool same = IsInteger(t) ? got.i == want.i : got.r == want.r;
    if (!same) {
      ADD_FAILURE() << DataTypeName(t) << " " << ReduceOpName(op) << " element " << i << " of " << n
                    << ": got " << (IsInteger(t) ? std::to_string(got.i) : std::to_string(got.r))
                    << ", want "
                    << (IsInteger(t) ? std::to_string(want.i) : std::to_string(want.r));
      return;
    }
  }
}

std::string Where(DataType t, ReduceOp op, int64_t n, const char* how) {
  return std::string(DataTypeName(t)) + " " + ReduceOpName(op) + " n=" + std::to_string(n) + " " +
         how;
}

// ---- Allreduce ----

void CheckAllreduce(HostComm& comm, DataType t, ReduceOp op, int64_t n) {
  const std::vector<uint8_t> in = MakeInputs(t, op, n);
  {
    SCOPED_TRACE(Where(t, op, n, "out of place"));
    std::vector<uint8_t> out(in.size() + 1, 0xee);
    EXPECT_TRUE(comm.Allreduce(in.data(), out.data(), n, t, op).ok());
    CheckReduced(t, op, out.data(), n, 0);
    EXPECT_EQ(out.back(), 0xee) << "wrote past the end";
  }
  {
    SCOPED_TRACE(Where(t, op, n, "in place"));
    std::vector<uint8_t> buf = in;
    EXPECT_TRUE(comm.Allreduce(buf.data(), buf.data(), n, t, op).ok());
    CheckReduced(t, op, buf.data(), n, 0);
  }
}

// First, so that two threads race to create the float16/bfloat16 MPI types and ops.
TEST(MpiHostCommThreads, ConcurrentCommsOnTwoThreads) {
  if (!g_thread_multiple) GTEST_SKIP() << "MPI_THREAD_MULTIPLE not provided";
  std::unique_ptr<HostComm> a = NewComm();
  std::unique_ptr<HostComm> b = NewComm();
  ASSERT_TRUE(a && b);
  std::thread ta([&] {
    for (int k = 0; k < 10; ++k) CheckAllreduce(*a, DataType::kFloat16, ReduceOp::kSum, 1000);
  });
  std::thread tb([&] {
    for (int k = 0; k < 10; ++k) CheckAllreduce(*b, DataType::kBfloat16, ReduceOp::kMax, 999);
  });
  ta.join();
  tb.join();
}

TEST(MpiHostComm, RankAndSize) {
  std::unique_ptr<HostComm> comm = NewComm();
  ASSERT_TRUE(comm);
  EXPECT_EQ(comm->rank(), g_rank);
  EXPECT_EQ(comm->size(), g_size);
  EXPECT_EQ(MakeMpiHostComm(MPI_COMM_NULL), nullptr);
}

TEST(MpiHostComm, AllreduceEveryTypeOpAndSize) {
  std::unique_ptr<HostComm> comm = NewComm();
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      for (int64_t n : {0, 1, 7, 1000, 4099}) CheckAllreduce(*comm, t, op, n);
    }
  }
}

TEST(MpiHostComm, AllreduceLarge) {
  std::unique_ptr<HostComm> comm = NewComm();
  const int64_t n = (int64_t{1} << 20) + 3;
  for (DataType t : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      CheckAllreduce(*comm, t, op, n);
    }
  }
}

TEST(MpiHostComm, AllreduceChunked) {
  std::unique_ptr<HostComm> comm = NewComm(/*max_per_call=*/1000);
  for (DataType t : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (int64_t n : {999, 1000, 1001, 4099}) CheckAllreduce(*comm, t, op, n);
    }
  }
}

// ---- Allgatherv ----

uint8_t GatherByte(int rank, int64_t i) { return static_cast<uint8_t>(rank * 131 + i * 7 + 1); }

void CheckAllgatherv(HostComm& comm, const std::vector<int64_t>& bytes, bool in_place) {
  SCOPED_TRACE(std::string("rank 0 sends ") + std::to_string(bytes[0]) +
               (in_place ? " in place" : ""));
  int64_t total = 0, mine = 0;
  for (int r = 0; r < g_size; ++r) {
    if (r == g_rank) mine = total;
    total += bytes[r];
  }
  std::vector<uint8_t> send(static_cast<size_t>(bytes[g_rank]));
  for (int64_t i = 0; i < bytes[g_rank]; ++i) send[i] = GatherByte(g_rank, i);
  std::vector<uint8_t> recv(static_cast<size_t>(total) + 1, 0xee);
  const void* src = send.data();
  if (in_place) {
    if (!send.empty()) std::memcpy(recv.data() + mine, send.data(), send.size());
    src = recv.data() + mine;
  }
  EXPECT_TRUE(comm.Allgatherv(src, bytes[g_rank], recv.data(), bytes).ok());
  int64_t off = 0;
  for (int r = 0; r < g_size; ++r) {
    for (int64_t i = 0; i < bytes[r]; ++i) {
      if (recv[off + i] != GatherByte(r, i)) {
        ADD_FAILURE() << "byte " << i << " from rank " << r;
        return;
      }
    }
    off += bytes[r];
  }
  EXPECT_EQ(recv.back(), 0xee);
}

TEST(MpiHostComm, Allgatherv) {
  std::unique_ptr<HostComm> comm = NewComm();
  for (int64_t base : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{4099}, int64_t{1} << 20}) {
    std::vector<int64_t> bytes(g_size);
    for (int r = 0; r < g_size; ++r) bytes[r] = base == 0 ? 0 : base + r * 13;
    if (base == 7) bytes[g_size - 1] = 0;  // one rank contributes nothing
    CheckAllgatherv(*comm, bytes, false);
    CheckAllgatherv(*comm, bytes, true);
  }
}

// ---- Broadcast ----

TEST(MpiHostComm, BroadcastFromEveryRoot) {
  std::unique_ptr<HostComm> plain = NewComm();
  std::unique_ptr<HostComm> chunked = NewComm(/*max_per_call=*/1000);
  for (HostComm* comm : {plain.get(), chunked.get()}) {
    for (int root = 0; root < g_size; ++root) {
      for (int64_t n :
           {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{4099}, (int64_t{1} << 20) + 3}) {
        SCOPED_TRACE("root " + std::to_string(root) + " n=" + std::to_string(n));
        std::vector<uint8_t> buf(static_cast<size_t>(n) + 1, 0xee);
        for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<uint8_t>(g_rank * 101 + i);
        EXPECT_TRUE(comm->Broadcast(buf.data(), n, root).ok());
        for (int64_t i = 0; i < n; ++i) {
          if (buf[i] != static_cast<uint8_t>(root * 101 + i)) {
            ADD_FAILURE() << "byte " << i;
            break;
          }
        }
        EXPECT_EQ(buf.back(), 0xee);
      }
    }
  }
}

// ---- Alltoallv ----

int64_t ExchangeBytes(int from, int to, int64_t scale) {
  const int64_t k = (from * 7 + to * 3) % 5;  // 0 for some pairs
  return k * scale;
}

uint8_t ExchangeByte(int from, int to, int64_t i) {
  return static_cast<uint8_t>(from * 17 + to * 29 + i);
}

TEST(MpiHostComm, Alltoallv) {
  std::unique_ptr<HostComm> comm = NewComm();
  for (int64_t scale : {int64_t{0}, int64_t{1}, int64_t{1001}, int64_t{1} << 18}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    std::vector<int64_t> send_bytes(g_size), recv_bytes(g_size);
    int64_t send_total = 0, recv_total = 0;
    for (int r = 0; r < g_size; ++r) {
      send_bytes[r] = ExchangeBytes(g_rank, r, scale);
      recv_bytes[r] = ExchangeBytes(r, g_rank, scale);
      send_total += send_bytes[r];
      recv_total += recv_bytes[r];
    }
    std::vector<uint8_t> send(static_cast<size_t>(send_total));
    int64_t off = 0;
    for (int r = 0; r < g_size; ++r) {
      for (int64_t i = 0; i < send_bytes[r]; ++i) send[off + i] = ExchangeByte(g_rank, r, i);
      off += send_bytes[r];
    }
    std::vector<uint8_t> recv(static_cast<size_t>(recv_total) + 1, 0xee);
    EXPECT_TRUE(comm->Alltoallv(send.data(), send_bytes, recv.data(), recv_bytes).ok());
    off = 0;
    for (int r = 0; r < g_size; ++r) {
      for (int64_t i = 0; i < recv_bytes[r]; ++i) {
        if (recv[off + i] != ExchangeByte(r, g_rank, i)) {
          ADD_FAILURE() << "byte " << i << " from rank " << r;
          return;
        }
      }
      off += recv_bytes[r];
    }
    EXPECT_EQ(recv.back(), 0xee);
  }
}

// ---- ReduceScatter ----

void CheckReduceScatter(HostComm& comm, DataType t, ReduceOp op,
                        const std::vector<int64_t>& counts) {
  int64_t total = 0, mine = 0;
  for (int r = 0; r < g_size; ++r) {
    if (r == g_rank) mine = total;
    total += counts[r];
  }
  const std::string shape = "counts[0]=" + std::to_string(counts[0]);
  const std::vector<uint8_t> in = MakeInputs(t, op, total);
  const size_t es = DataTypeSize(t);
  {
    SCOPED_TRACE(Where(t, op, total, "out of place") + " " + shape);
    std::vector<uint8_t> out(static_cast<size_t>(counts[g_rank]) * es + 1, 0xee);
    EXPECT_TRUE(comm.ReduceScatter(in.data(), out.data(), counts, t, op).ok());
    CheckReduced(t, op, out.data(), counts[g_rank], mine);
    EXPECT_EQ(out.back(), 0xee);
  }
  {
    SCOPED_TRACE(Where(t, op, total, "in place") + " " + shape);
    std::vector<uint8_t> buf = in;
    EXPECT_TRUE(comm.ReduceScatter(buf.data(), buf.data(), counts, t, op).ok());
    CheckReduced(t, op, buf.data(), counts[g_rank], mine);
  }
}

TEST(MpiHostComm, ReduceScatterEveryTypeOpAndShape) {
  std::unique_ptr<HostComm> comm = NewComm();
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      for (int64_t base : {0, 1, 7, 1000, 4099}) {
        std::vector<int64_t> counts(g_size);
        for (int r = 0; r < g_size; ++r) counts[r] = base == 0 ? 0 : base + r;
        if (base == 7) counts[0] = 0;  // a rank that receives nothing
        CheckReduceScatter(*comm, t, op, counts);
      }
    }
  }
}

TEST(MpiHostComm, ReduceScatterLarge) {
  std::unique_ptr<HostComm> comm = NewComm();
  const std::vector<int64_t> counts(g_size, (int64_t{1} << 19) + 1);
  for (DataType t : {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32, DataType::kInt64,
                     DataType::kBool}) {
    CheckReduceScatter(*comm, t, ReduceOp::kSum, counts);
  }
}

TEST(MpiHostComm, Barrier) {
  std::unique_ptr<HostComm> comm = NewComm();
  for (int k = 0; k < 5; ++k) EXPECT_TRUE(comm->Barrier().ok());
}

// ---- Errors ----

TEST(MpiHostComm, InvalidArgumentsFailBeforeAnyMpiCall) {
  std::unique_ptr<HostComm> comm = NewComm();
  std::vector<uint8_t> buf(64);
  auto invalid = [](const Status& s) { return s.code() == StatusCode::kInvalidArgument; };
  EXPECT_TRUE(
      invalid(comm->Allreduce(buf.data(), buf.data(), -1, DataType::kFloat32, ReduceOp::kSum)));
  EXPECT_TRUE(
      invalid(comm->Allreduce(buf.data(), buf.data(), 4, DataType::kFloat32, ReduceOp::kAdasum)));
  EXPECT_TRUE(invalid(
      comm->Allreduce(buf.data(), buf.data(), 4, static_cast<DataType>(42), ReduceOp::kSum)));
  const std::vector<int64_t> wrong_size(g_size + 1, 1);
  EXPECT_TRUE(invalid(comm->Allgatherv(buf.data(), 1, buf.data(), wrong_size)));
  std::vector<int64_t> ones(g_size, 1);
  EXPECT_TRUE(invalid(comm->Allgatherv(buf.data(), 2, buf.data(), ones)));  // != recv_bytes[me]
  std::vector<int64_t> huge(g_size, 1);
  huge[0] = int64_t{INT_MAX} + 1;
  const Status s = comm->Allgatherv(buf.data(), huge[g_rank], buf.data(), huge);
  EXPECT_TRUE(invalid(s)) << s.ToString();
  EXPECT_NE(s.message().find("INT_MAX"), std::string::npos) << s.message();
  std::vector<int64_t> far(g_size, INT_MAX / 2 + 1);  // each fits, an offset does not
  if (g_size >= 3) {
    EXPECT_TRUE(invalid(comm->Allgatherv(buf.data(), far[g_rank], buf.data(), far)));
  }
  std::vector<int64_t> negative(g_size, 1);
  negative[0] = -1;
  EXPECT_TRUE(invalid(comm->Alltoallv(buf.data(), negative, buf.data(), ones)));
  EXPECT_TRUE(invalid(comm->Alltoallv(buf.data(), ones, buf.data(), wrong_size)));
  EXPECT_TRUE(invalid(comm->Broadcast(buf.data(), 4, g_size)));
  EXPECT_TRUE(invalid(comm->Broadcast(buf.data(), 4, -1)));
  EXPECT_TRUE(invalid(comm->Broadcast(buf.data(), -4, 0)));
  EXPECT_TRUE(invalid(
      comm->ReduceScatter(buf.data(), buf.data(), huge, DataType::kFloat32, ReduceOp::kSum)));
  std::vector<int64_t> big_total(g_size, INT_MAX / 2 + 1);
  EXPECT_TRUE(invalid(
      comm->ReduceScatter(buf.data(), buf.data(), big_total, DataType::kFloat32, ReduceOp::kSum)));
  EXPECT_TRUE(invalid(
      comm->ReduceScatter(buf.data(), buf.data(), ones, DataType::kFloat32, ReduceOp::kAdasum)));
  // The communicator still works after all of that.
  CheckAllreduce(*comm, DataType::kInt32, ReduceOp::kSum, 7);
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

// Non-zero ranks print only their failures, tagged with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", g_rank,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }
};

}  // namespace
}  // namespace hvdc

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &hvdc::g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &hvdc::g_size);
  ::testing::InitGoogleTest(&argc, argv);
  hvdc::g_thread_multiple = provided >= MPI_THREAD_MULTIPLE;
  if (hvdc::g_rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new hvdc::FailurePrinter);
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int ranks_failed = 0;
  MPI_Allreduce(&failed, &ranks_failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (hvdc::g_rank == 0 && ranks_failed > 0) {
    std::fprintf(stderr, "%d of %d ranks had failures\n", ranks_failed, hvdc::g_size);
  }
  MPI_Finalize();
  return ranks_failed > 0 ? 1 : 0;
}

// ShmHostComm::AllreducePieces (the shared-memory plane's fused allreduce): pieces of odd sizes
// (0, 1, not a multiple of the rank count, several times a slot) taken as one vector, copied in
// from the pieces with the prescale and out into their outputs with the postscale; a joined
// rank's piece (no input, no output), an input-less piece that still gets the result, in place
// and out of place. Expected values are computed here; every rank must get the same bits. Ranks
// as threads, 2 to 4 of them, over 64 KiB segments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "local_controller/local_world.h"
#include "ops/cpu/kernels.h"
#include "shm_controller/shm_host_comm.h"
#include "shm_controller/shm_transport.h"
#include "tests/cpp/conformance/suite_util.h"
#include "tests/cpp/conformance/values.h"

namespace hvdc {
namespace {

using conformance::Elem;
using conformance::MakeSet;
using conformance::Range;
using conformance::ThreadWorld;
using conformance::World;

std::unique_ptr<World> MakeShmWorld(int n) {
  return ThreadWorld::Make(n, [](int size) {
    std::shared_ptr<LocalWorld> world = LocalWorld::Create(size);
    shm::ShmOptions o;
    o.bytes = 64 * 1024;
    o.host = "one-host";
    std::vector<std::unique_ptr<Transport>> out;
    for (int r = 0; r < size; ++r)
      out.push_back(shm::MakeShmTransport(MakeLocalTransport(world, r), o));
    return out;
  });
}

bool IsFloat(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBfloat16 ||
         t == DataType::kFloat64;
}

// Element i of piece j on rank r: multiples of 1/4 up to 7.75 in magnitude for floats (so the
// prescaled sums over 4 ranks are exact even in bfloat16), small integers otherwise.
Elem Value(DataType t, int r, int j, int64_t i) {
  const int64_t k = (i * 7 + j * 11 + r * 5) % 63 - 31;
  Elem e;
  if (IsFloat(t)) {
    e.r = 0.25 * static_cast<double>(k);
  } else {
    e.i = k * 37 + r;
  }
  return e;
}

// How each piece is passed: on every rank, or only on one rank (the others pass it normally).
enum class Mode {
  kOutOfPlace,
  kInPlace,
  kJoinedOnLast,   // the last rank contributes zeros and discards the result
  kNoInputOnFirst  // rank 0 contributes zeros but still gets the result
};

struct PieceSpec {
  int64_t count;
  Mode mode;
};

// Pieces of 0, 1, 7, n + 1 elements and two of more than a slot, summing to more than 3.5 slots.
std::vector<PieceSpec> Specs(int64_t slot_elems, int n) {
  return {{0, Mode::kOutOfPlace},
          {1, Mode::kInPlace},
          {slot_elems * 3 / 2 + 3, Mode::kOutOfPlace},
          {7, Mode::kJoinedOnLast},
          {0, Mode::kInPlace},
          {slot_elems * 2 + 1, Mode::kInPlace},
          {n + 1, Mode::kNoInputOnFirst},
          {slot_elems / 3 + 5, Mode::kJoinedOnLast},
          {13, Mode::kOutOfPlace}};
}

bool Contributes(Mode m, int r, int n) {
  return !(m == Mode::kJoinedOnLast && r == n - 1) && !(m == Mode::kNoInputOnFirst && r == 0);
}

// The expected bits of piece j: the prescaled inputs of the contributing ranks summed exactly,
// then postscaled by the kernel the plane uses.
std::vector<uint8_t> Expected(DataType t, const PieceSpec& spec, int j, int n, double prescale,
                              double postscale) {
  const int64_t es = static_cast<int64_t>(DataTypeSize(t));
  std::vector<uint8_t> out(static_cast<size_t>(spec.count * es));
  for (int64_t i = 0; i < spec.count; ++i) {
    Elem sum;
    for (int r = 0; r < n; ++r) {
      if (!Contributes(spec.mode, r, n)) continue;
      const Elem v = Value(t, r, j, i);
      sum.r += v.r * prescale;
      sum.i += static_cast<int64_t>(static_cast<double>(v.i) * prescale);
    }
    conformance::Write(t, out.data(), i, sum);
  }
  cpu::ScaleCopy(out.data(), out.data(), spec.count, t, postscale);
  return out;
}

constexpr uint8_t kGuard = 0xee;

void CheckPieces(int n, DataType t, double prescale, double postscale) {
  SCOPED_TRACE(std::to_string(n) + " ranks, " + DataTypeName(t) + ", prescale " +
               std::to_string(prescale) + ", postscale " + std::to_string(postscale));
  const int64_t es = static_cast<int64_t>(DataTypeSize(t));
  auto world = MakeShmWorld(n);
  ASSERT_NE(world, nullptr);
  world->Run([&](Transport& transport) {
    ProcessSetChannels set = MakeSet(transport, Range(0, n));
    if (!set.data) return;
    auto* plane = dynamic_cast<shm::ShmHostComm*>(set.data.get());
    EXPECT_NE(plane, nullptr);
    if (plane == nullptr) return;
    EXPECT_TRUE(plane->allreduces_pieces());
    const int r = plane->rank();
    const std::vector<PieceSpec> specs = Specs(plane->slot_bytes() / es, n);
    int64_t total = 0;
    for (const PieceSpec& s : specs) total += s.count;
    EXPECT_GT(total * es, plane->slot_bytes() * 7 / 2);
    // Per piece: its input (with a guard byte) and, out of place, its output (with a guard byte).
    std::vector<std::vector<uint8_t>> ins(specs.size()), outs(specs.size());
    std::vector<ReducePiece> pieces;
    for (size_t j = 0; j < specs.size(); ++j) {
      const PieceSpec& s = specs[j];
      ins[j].assign(static_cast<size_t>(s.count * es + 1), kGuard);
      for (int64_t i = 0; i < s.count; ++i) {
        conformance::Write(t, ins[j].data(), i, Value(t, r, static_cast<int>(j), i));
      }
      ReducePiece p{ins[j].data(), ins[j].data(), s.count};
      if (s.mode != Mode::kInPlace) {
        outs[j].assign(static_cast<size_t>(s.count * es + 1), kGuard);
        p.out = outs[j].data();
      }
      if (!Contributes(s.mode, r, n)) p.in = nullptr;
      if (s.mode == Mode::kJoinedOnLast && r == n - 1) p.out = nullptr;
      pieces.push_back(p);
    }
    const Status status = plane->AllreducePieces(pieces, t, ReduceOp::kSum, prescale, postscale);
    EXPECT_TRUE(status.ok()) << status.ToString();
    for (size_t j = 0; j < specs.size(); ++j) {
      const PieceSpec& s = specs[j];
      SCOPED_TRACE("rank " + std::to_string(r) + ", piece " + std::to_string(j) + " of " +
                   std::to_string(s.count));
      const std::vector<uint8_t> want = Expected(t, s, static_cast<int>(j), n, prescale, postscale);
      const std::vector<uint8_t>& got = s.mode == Mode::kInPlace ? ins[j] : outs[j];
      if (pieces[j].out != nullptr) {
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin()));
        EXPECT_EQ(got.back(), kGuard);
      } else {
        EXPECT_EQ(std::count(outs[j].begin(), outs[j].end(), kGuard),
                  static_cast<std::ptrdiff_t>(outs[j].size()))
            << "a discarded piece's buffer was written";
      }
      if (s.mode != Mode::kInPlace) {  // the input is left alone
        for (int64_t i = 0; i < s.count; ++i) {
          if (!(conformance::Read(t, ins[j].data(), i) == Value(t, r, static_cast<int>(j), i))) {
            ADD_FAILURE() << "input element " << i << " changed";
            break;
          }
        }
        EXPECT_EQ(ins[j].back(), kGuard);
      }
    }
  });
}

TEST(ShmAllreducePieces, OddPiecesScaledAndExactOnEveryRank) {
  for (int n : {2, 3, 4}) {
    for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBfloat16}) {
      CheckPieces(n, t, 1.0, 1.0);      // Sum
      CheckPieces(n, t, 0.5, 1.0 / n);  // Average, with a prescale
    }
    CheckPieces(n, DataType::kInt32, 1.0, 1.0);
    CheckPieces(n, DataType::kInt32, 2.0, 1.0 / n);
  }
}

// Inexact float sums (the reduction order matters), Average: every rank still gets the same bits,
// close to the sum in double.
TEST(ShmAllreducePieces, InexactAverageIsBitIdentical) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    const std::vector<int64_t> counts = {3, 0, 9001, 1, 12345, 17};
    std::vector<std::vector<float>> results(n);
    auto world = MakeShmWorld(n);
    ASSERT_NE(world, nullptr);
    world->Run([&](Transport& transport) {
      ProcessSetChannels set = MakeSet(transport, Range(0, n));
      if (!set.data) return;
      const int r = set.data->rank();
      std::vector<std::vector<float>> bufs;
      std::vector<ReducePiece> pieces;
      for (size_t j = 0; j < counts.size(); ++j) {
        bufs.emplace_back(static_cast<size_t>(counts[j]));
        for (int64_t i = 0; i < counts[j]; ++i) {
          bufs[j][i] = 1.0f / static_cast<float>(1 + r + (i + j) % 13) + 1e-3f * r;
        }
      }
      for (auto& b : bufs) pieces.push_back({b.data(), b.data(), static_cast<int64_t>(b.size())});
      const Status s =
          set.data->AllreducePieces(pieces, DataType::kFloat32, ReduceOp::kSum, 1.0, 1.0 / n);
      EXPECT_TRUE(s.ok()) << s.ToString();
      for (auto& b : bufs) results[r].insert(results[r].end(), b.begin(), b.end());
    });
    for (int r = 1; r < n; ++r) {
      ASSERT_EQ(results[r].size(), results[0].size());
      EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), results[0].size() * 4), 0)
          << "rank " << r << " differs from rank 0";
    }
    int64_t at = 0, bad = 0;
    for (size_t j = 0; j < counts.size(); ++j) {
      for (int64_t i = 0; i < counts[j]; ++i, ++at) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += 1.0 / (1 + r + (i + j) % 13) + 1e-3 * r;
        want /= n;
        if (std::fabs(results[0][at] - want) > 1e-6 * (1 + std::fabs(want))) ++bad;
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// Ranks that disagree on the total all fail, and the plane stays usable.
TEST(ShmAllreducePieces, DisagreeingTotalsFailOnEveryRank) {
  const int n = 3;
  auto world = MakeShmWorld(n);
  ASSERT_NE(world, nullptr);
  world->Run([&](Transport& transport) {
    ProcessSetChannels set = MakeSet(transport, Range(0, n));
    if (!set.data) return;
    const int r = set.data->rank();
    std::vector<int32_t> v(8, r + 1);
    const int64_t mine = r == 1 ? 7 : 8;
    const Status s =
        set.data->AllreducePieces({{v.data(), v.data(), 3}, {v.data() + 3, v.data() + 3, mine - 3}},
                                  DataType::kInt32, ReduceOp::kSum, 1, 1);
    EXPECT_EQ(s.code(), StatusCode::kPreconditionError) << s.ToString();
    std::vector<int32_t> w(5, r + 1);
    EXPECT_TRUE(
        set.data->AllreducePieces({{w.data(), w.data(), 5}}, DataType::kInt32, ReduceOp::kSum, 1, 1)
            .ok());
    EXPECT_EQ(w, std::vector<int32_t>(5, n * (n + 1) / 2));
  });
}

}  // namespace
}  // namespace hvdc

// The host backend's allreduce batches (ops/cpu/host_backend.cc), run directly on each rank's
// process-set comm: fused and unfused Average batches (prescale too), a joined rank, in place and
// out of place, aliased tensors. Over the shared-memory plane the batch is one AllreducePieces
// call (no fusion buffer); over the in-memory plane it packs the fusion buffer. Both must give the
// computed results. Ranks as threads.
#include "ops/cpu/host_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/batch.h"
#include "local_controller/local_world.h"
#include "ops/cpu/kernels.h"
#include "shm_controller/shm_host_comm.h"
#include "shm_controller/shm_transport.h"
#include "tests/cpp/conformance/suite_util.h"

namespace hvdc {
namespace {

using conformance::MakeSet;
using conformance::Range;
using conformance::ThreadWorld;
using conformance::World;

std::unique_ptr<World> MakeWorld(int n, bool shm) {
  return ThreadWorld::Make(n, [shm](int size) {
    std::shared_ptr<LocalWorld> world = LocalWorld::Create(size);
    shm::ShmOptions o;
    o.bytes = 64 * 1024;
    o.host = "one-host";
    std::vector<std::unique_ptr<Transport>> out;
    for (int r = 0; r < size; ++r) {
      std::unique_ptr<Transport> t = MakeLocalTransport(world, r);
      out.push_back(shm ? shm::MakeShmTransport(std::move(t), o) : std::move(t));
    }
    return out;
  });
}

// Element i of tensor j on rank r: a multiple of 1/4, so the sums are exact.
float Value(int r, int j, int64_t i) {
  return 0.25f * static_cast<float>((i * 5 + j * 3 + r * 7) % 41 - 20);
}

struct Tensor {
  int64_t count;
  bool in_place;
};

// What a rank holds for one batch: the tensors' buffers and the items pointing at them.
struct RankBatch {
  std::vector<std::vector<float>> in, out;
  Batch batch;
};

// Rank r's batch of `tensors`, Average (sum, prescale, postscale 1/n); the last rank has joined
// (no entries) when `joined`.
RankBatch MakeBatch(const std::vector<Tensor>& tensors, int r, int n, bool fused, bool joined,
                    double prescale) {
  RankBatch rb;
  rb.batch.op = OpType::kAllreduce;
  rb.batch.dtype = DataType::kFloat32;
  rb.batch.reduce_op = ReduceOp::kSum;
  rb.batch.prescale = prescale;
  rb.batch.postscale = 1.0 / n;
  rb.batch.fused = fused;
  rb.in.resize(tensors.size());
  rb.out.resize(tensors.size());
  for (size_t j = 0; j < tensors.size(); ++j) {
    auto response = std::make_shared<Response>();
    response->name = "t" + std::to_string(j);
    response->shape = {tensors[j].count};
    BatchItem item;
    item.response = response;
    if (!(joined && r == n - 1)) {
      rb.in[j].resize(static_cast<size_t>(tensors[j].count));
      for (int64_t i = 0; i < tensors[j].count; ++i) rb.in[j][i] = Value(r, static_cast<int>(j), i);
      item.entry = NewEntry([](const Status&) {});
      item.entry->input = rb.in[j].data();
      if (tensors[j].in_place) {
        item.entry->output = rb.in[j].data();
      } else {
        rb.out[j].assign(static_cast<size_t>(tensors[j].count), -99.0f);
        item.entry->output = rb.out[j].data();
      }
    }
    rb.batch.items.push_back(std::move(item));
  }
  return rb;
}

// The expected Average of tensor j, scaled the way the kernels scale.
std::vector<float> Expected(int64_t count, int j, int n, bool joined, double prescale) {
  std::vector<float> sum(static_cast<size_t>(count), 0.0f);
  for (int r = 0; r < n - (joined ? 1 : 0); ++r) {
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) v[i] = Value(r, j, i);
    cpu::ScaleCopy(v.data(), v.data(), count, DataType::kFloat32, prescale);
    for (int64_t i = 0; i < count; ++i) sum[i] += v[i];
  }
  cpu::ScaleCopy(sum.data(), sum.data(), count, DataType::kFloat32, 1.0 / n);
  return sum;
}

void CheckBatch(bool shm, int n, bool fused, bool joined, double prescale,
                const std::vector<Tensor>& tensors) {
  SCOPED_TRACE(std::string(shm ? "shm" : "local") + ", " + std::to_string(n) + " ranks, " +
               (fused ? "fused" : "unfused") + (joined ? ", last rank joined" : "") +
               ", prescale " + std::to_string(prescale));
  auto world = MakeWorld(n, shm);
  ASSERT_NE(world, nullptr);
  std::unique_ptr<Backend> backend = MakeHostBackend();
  world->Run([&](Transport& transport) {
    ProcessSetChannels set = MakeSet(transport, Range(0, n));
    if (!set.data) return;
    EXPECT_EQ(set.data->allreduces_pieces(), shm);
    const int r = set.data->rank();
    Config config;
    config.chunk_bytes = 4096;
    FusionBuffer buffer;
    ExecutionContext ctx;
    ctx.config = &config;
    ctx.comm = set.data.get();
    ctx.buffer = &buffer;
    RankBatch rb = MakeBatch(tensors, r, n, fused, joined, prescale);
    const Status s = backend->Execute(rb.batch, ctx);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (shm && fused) {
      EXPECT_EQ(buffer.capacity(), 0) << "the fusion buffer was used";
    }
    if (joined && r == n - 1) return;
    for (size_t j = 0; j < tensors.size(); ++j) {
      const std::vector<float>& got = tensors[j].in_place ? rb.in[j] : rb.out[j];
      const std::vector<float> want =
          Expected(tensors[j].count, static_cast<int>(j), n, joined, prescale);
      EXPECT_EQ(got, want) << "rank " << r << ", tensor " << j;
    }
  });
}

TEST(HostBackend, FusedAverageOverEachPlane) {
  // Sizes 0, 1, odd, and (at 64 KiB segments) more than a slot in all.
  const std::vector<Tensor> tensors = {{5, false},    {0, true}, {1, true},
                                       {3001, false}, {7, true}, {6000, true}};
  for (bool shm : {true, false}) {
    for (int n : {2, 3}) {
      CheckBatch(shm, n, /*fused=*/true, /*joined=*/false, 1.0, tensors);
      CheckBatch(shm, n, /*fused=*/true, /*joined=*/true, 0.5, tensors);
    }
  }
}

TEST(HostBackend, UnfusedAverageOverEachPlane) {
  const std::vector<Tensor> tensors = {{20000, false}, {9999, true}};
  for (bool shm : {true, false}) {
    CheckBatch(shm, 3, /*fused=*/false, /*joined=*/false, 1.0, tensors);
    CheckBatch(shm, 3, /*fused=*/false, /*joined=*/true, 0.5, tensors);
  }
}

// Tensors whose memory overlaps (one's output is another's input) still get what the fusion
// buffer would give them: the inputs are staged first.
TEST(HostBackend, AliasedTensorsOverShm) {
  const int n = 2;
  auto world = MakeWorld(n, /*shm=*/true);
  ASSERT_NE(world, nullptr);
  std::unique_ptr<Backend> backend = MakeHostBackend();
  world->Run([&](Transport& transport) {
    ProcessSetChannels set = MakeSet(transport, Range(0, n));
    if (!set.data) return;
    const int r = set.data->rank();
    Config config;
    FusionBuffer buffer;
    ExecutionContext ctx;
    ctx.config = &config;
    ctx.comm = set.data.get();
    ctx.buffer = &buffer;
    // mem = [a (4) | b (4)]: tensor 0 reads a and writes b, tensor 1 reads b and writes a.
    std::vector<float> mem = {1, 2, 3, 4, 10, 20, 30, 40};
    for (float& x : mem) x *= static_cast<float>(r + 1);
    Batch batch;
    batch.fused = true;
    for (int j = 0; j < 2; ++j) {
      auto response = std::make_shared<Response>();
      response->shape = {4};
      BatchItem item;
      item.response = response;
      item.entry = NewEntry([](const Status&) {});
      item.entry->input = mem.data() + 4 * j;
      item.entry->output = mem.data() + 4 * (1 - j);
      batch.items.push_back(std::move(item));
    }
    const Status s = backend->Execute(batch, ctx);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(mem, (std::vector<float>{30, 60, 90, 120, 3, 6, 9, 12}));
  });
}

}  // namespace
}  // namespace hvdc

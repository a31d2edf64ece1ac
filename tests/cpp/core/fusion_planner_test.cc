// PlanBatches (core/fusion_planner.h): which of a round's responses run together. Sizes are chosen
// around the fusion threshold and the zero-copy size; each expectation is computed from the
// tensors' byte sizes (padded to 64 bytes inside the fusion buffer) and the settings.
#include "core/fusion_planner.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hvdc {
namespace {

using Ready = std::vector<BatchItem>;

int64_t Padded(int64_t bytes) { return (bytes + 63) / 64 * 64; }

Response Allreduce(const std::string& name, int64_t count, DataType dtype = DataType::kFloat32) {
  Response r;
  r.op = OpType::kAllreduce;
  r.name = name;
  r.dtype = dtype;
  r.shape = {count};
  return r;
}

int64_t Bytes(const Response& r) {
  return NumElements(r.shape) * static_cast<int64_t>(DataTypeSize(r.dtype));
}

Ready WithEntries(const std::vector<Response>& responses) {
  Ready ready;
  for (const Response& r : responses) {
    auto e = std::make_shared<TensorEntry>();
    e->request.name = r.name;
    ready.push_back(BatchItem{std::make_shared<const Response>(r), std::move(e)});
  }
  return ready;
}

Config Settings(int64_t threshold, int64_t zero_copy = int64_t{1} << 40) {
  Config c;
  c.fusion_threshold_bytes = threshold;
  c.zero_copy_bytes = zero_copy;
  return c;
}

std::vector<std::vector<std::string>> Names(const std::vector<Batch>& batches) {
  std::vector<std::vector<std::string>> out;
  for (const Batch& b : batches) {
    out.emplace_back();
    for (const BatchItem& i : b.items) out.back().push_back(i.response->name);
  }
  return out;
}

// What holds for every plan: each response lands in exactly one batch, in input order within
// its batch and across batches by first member, with its own entry; a fused batch holds only
// fusible allreduces of one kind and fits the threshold; an unfused batch holds one item.
void CheckInvariants(const std::vector<Response>& in, const std::vector<Batch>& batches,
                     const Config& config) {
  std::map<std::string, size_t> position;
  for (size_t i = 0; i < in.size(); ++i) position[in[i].name] = i;
  size_t total = 0;
  size_t last_first = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    const Batch& batch = batches[b];
    ASSERT_FALSE(batch.items.empty());
    total += batch.items.size();
    const size_t first = position.at(batch.items.front().response->name);
    if (b > 0) {
      EXPECT_GT(first, last_first) << "batches are ordered by their first member";
    }
    last_first = first;
    int64_t padded = 0;
    for (size_t i = 0; i < batch.items.size(); ++i) {
      const BatchItem& item = batch.items[i];
      ASSERT_NE(item.entry, nullptr);
      EXPECT_EQ(item.entry->request.name, item.response->name) << "the entry travels with it";
      if (i > 0) {
        EXPECT_GT(position.at(item.response->name), position.at(batch.items[i - 1].response->name));
      }
      EXPECT_EQ(item.response->dtype, batch.dtype);
      EXPECT_EQ(item.response->device, batch.device);
      EXPECT_EQ(item.response->op, batch.op);
      padded += Padded(Bytes(*item.response));
    }
    if (batch.fused) {
      EXPECT_EQ(batch.op, OpType::kAllreduce);
      if (batch.items.size() > 1) {
        EXPECT_LE(padded, config.fusion_threshold_bytes) << "batch " << b;
      } else {
        EXPECT_LE(Bytes(*batch.items[0].response), config.fusion_threshold_bytes) << "batch " << b;
      }
    } else {
      EXPECT_EQ(batch.items.size(), 1u) << "batch " << b;
    }
  }
  EXPECT_EQ(total, in.size());
}

std::vector<Batch> Plan(const std::vector<Response>& in, const Config& config, int set_size = 2) {
  std::vector<Batch> batches = PlanBatches(WithEntries(in), config, set_size);
  CheckInvariants(in, batches, config);
  return batches;
}

TEST(FusionPlanner, NothingReadyPlansNothing) {
  EXPECT_TRUE(PlanBatches({}, Settings(4096), 3).empty());
}

TEST(FusionPlanner, OneTensorIsOneBatchWithItsParameters) {
  Response r = Allreduce("only", 10, DataType::kFloat64);
  r.device = 1;
  r.reduce_op = ReduceOp::kMax;
  r.prescale = 0.25;
  r.postscale = 3.0;
  const auto batches = Plan({r}, Settings(4096));
  ASSERT_EQ(batches.size(), 1u);
  const Batch& b = batches[0];
  EXPECT_TRUE(b.fused);
  EXPECT_EQ(b.dtype, r.dtype);
  EXPECT_EQ(b.device, r.device);
  EXPECT_EQ(b.reduce_op, r.reduce_op);
  EXPECT_EQ(b.prescale, r.prescale);
  EXPECT_EQ(b.postscale, r.postscale);
  EXPECT_EQ(b.error_code, StatusCode::kOk);
}

TEST(FusionPlanner, AverageBecomesASumScaledByTheSetSize) {
  for (int set_size : {1, 2, 3, 8}) {
    Response r = Allreduce("avg", 4);
    r.reduce_op = ReduceOp::kAverage;
    r.postscale = 0.5;
    for (const Config& config : {Settings(4096), Settings(0)}) {  // fused and unfused
      const auto batches = Plan({r}, config, set_size);
      ASSERT_EQ(batches.size(), 1u);
      EXPECT_EQ(batches[0].reduce_op, ReduceOp::kSum);
      EXPECT_DOUBLE_EQ(batches[0].postscale, r.postscale / set_size);
    }
  }
}

// One tensor of threshold-1, threshold and threshold+1 bytes: it is fused up to the threshold.
TEST(FusionPlanner, OneTensorAroundTheThreshold) {
  const int64_t threshold = 1024;
  for (int64_t bytes : {threshold - 1, threshold, threshold + 1}) {
    const Response r = Allreduce("t", bytes, DataType::kUint8);
    const auto batches = Plan({r}, Settings(threshold));
    ASSERT_EQ(batches.size(), 1u);
    EXPECT_EQ(batches[0].fused, bytes <= threshold) << bytes;
  }
}

// Two tensors whose padded sizes add up to S, with the threshold at S-1, S and S+1: they share a
// batch exactly when S fits.
TEST(FusionPlanner, TwoTensorsAroundTheThreshold) {
  for (int64_t a_bytes : {1, 64, 100, 700}) {
    for (int64_t b_bytes : {1, 63, 65, 300}) {
      const Response a = Allreduce("a", a_bytes, DataType::kUint8);
      const Response b = Allreduce("b", b_bytes, DataType::kUint8);
      const int64_t together = Padded(a_bytes) + Padded(b_bytes);
      for (int64_t threshold : {together - 1, together, together + 1}) {
        const auto batches = Plan({a, b}, Settings(threshold));
        const size_t expect = together <= threshold ? 1 : 2;
        EXPECT_EQ(batches.size(), expect)
            << a_bytes << " + " << b_bytes << " bytes, threshold " << threshold;
      }
    }
  }
}

// Many equal tensors fill batches of floor(threshold / padded size) each.
TEST(FusionPlanner, EqualTensorsFillBatchesUpToTheThreshold) {
  for (int64_t count : {1, 16, 17, 100}) {  // float32 elements
    for (int n : {1, 5, 12}) {
      std::vector<Response> in;
      for (int i = 0; i < n; ++i) in.push_back(Allreduce("t" + std::to_string(i), count));
      const int64_t padded = Padded(count * 4);
      const int64_t threshold = 4 * padded + padded / 2;  // room for 4 and a half
      const auto batches = Plan(in, Settings(threshold));
      const int per_batch = static_cast<int>(threshold / padded);
      ASSERT_EQ(batches.size(), static_cast<size_t>((n + per_batch - 1) / per_batch));
      for (size_t b = 0; b < batches.size(); ++b) {
        const int expect = std::min(per_batch, n - static_cast<int>(b) * per_batch);
        EXPECT_EQ(batches[b].items.size(), static_cast<size_t>(expect)) << count << " " << b;
        EXPECT_TRUE(batches[b].fused);
      }
    }
  }
}

TEST(FusionPlanner, FusionThresholdZeroRunsEveryTensorAlone) {
  std::vector<Response> in;
  for (int i = 0; i < 5; ++i) in.push_back(Allreduce("t" + std::to_string(i), 1));
  const auto batches = Plan(in, Settings(0));
  ASSERT_EQ(batches.size(), in.size());
  for (const Batch& b : batches) EXPECT_FALSE(b.fused);
}

// A tensor of at least HVDC_ZERO_COPY_BYTES runs alone from its own memory, below the threshold.
TEST(FusionPlanner, ZeroCopySizeAndAbove) {
  const int64_t zero_copy = 512;
  for (int64_t bytes : {zero_copy - 1, zero_copy, zero_copy + 1}) {
    const Response small = Allreduce("small", 8, DataType::kUint8);
    const Response t = Allreduce("t", bytes, DataType::kUint8);
    const auto batches = Plan({small, t}, Settings(1 << 20, zero_copy));
    const bool zero_copied = bytes >= zero_copy;
    ASSERT_EQ(batches.size(), zero_copied ? 2u : 1u) << bytes;
    EXPECT_EQ(batches.back().fused, !zero_copied) << bytes;
  }
}

// Chunking is the backend's business: the plan is the same whatever HVDC_CHUNK_BYTES is.
TEST(FusionPlanner, ChunkSizeDoesNotChangeThePlan) {
  std::vector<Response> in;
  for (int i = 0; i < 9; ++i) in.push_back(Allreduce("t" + std::to_string(i), 40 * (i + 1)));
  Config base = Settings(2048, 1024);
  const auto want = Names(Plan(in, base));
  for (int64_t chunk : {int64_t{1}, int64_t{64}, int64_t{1000}, int64_t{1} << 30}) {
    Config c = base;
    c.chunk_bytes = chunk;
    EXPECT_EQ(Names(Plan(in, c)), want) << chunk;
  }
}

// Interleaved dtypes: one batch per dtype, members in input order.
TEST(FusionPlanner, MixedDtypesFuseByDtype) {
  const std::vector<DataType> dtypes = {DataType::kFloat32, DataType::kFloat64, DataType::kInt32,
                                        DataType::kFloat16};
  std::vector<Response> in;
  std::map<DataType, std::vector<std::string>> want;
  std::vector<DataType> first_seen;
  for (int i = 0; i < 11; ++i) {
    const DataType dt = dtypes[(i * 3) % dtypes.size()];
    in.push_back(Allreduce("t" + std::to_string(i), 3, dt));
    if (want[dt].empty()) first_seen.push_back(dt);
    want[dt].push_back(in.back().name);
  }
  const auto batches = Plan(in, Settings(1 << 20));
  ASSERT_EQ(batches.size(), first_seen.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    EXPECT_EQ(batches[b].dtype, first_seen[b]);
    EXPECT_EQ(Names({batches[b]})[0], want[first_seen[b]]);
  }
}

// Tensors differing in any of device, reduce op, prescale or postscale never share a batch.
TEST(FusionPlanner, DifferentReductionParametersDoNotFuse) {
  std::vector<Response> in;
  Response base = Allreduce("base", 4);
  in.push_back(base);
  Response r = base;
  r.name = "device";
  r.device = 0;
  in.push_back(r);
  r = base;
  r.name = "op";
  r.reduce_op = ReduceOp::kMin;
  in.push_back(r);
  r = base;
  r.name = "pre";
  r.prescale = 2.0;
  in.push_back(r);
  r = base;
  r.name = "post";
  r.postscale = 0.5;
  in.push_back(r);
  r = base;
  r.name = "same";
  in.push_back(r);  // fuses with base
  const auto batches = Plan(in, Settings(1 << 20));
  ASSERT_EQ(batches.size(), in.size() - 1);
  EXPECT_EQ(Names(batches)[0], (std::vector<std::string>{"base", "same"}));
}

// Only allreduces are fused; failed negotiations run alone and carry their error.
TEST(FusionPlanner, OtherOpsAndErrorsRunAlone) {
  std::vector<Response> in;
  in.push_back(Allreduce("a0", 4));
  for (OpType op : {OpType::kAllgather, OpType::kBroadcast, OpType::kAlltoall,
                    OpType::kReducescatter, OpType::kBarrier, OpType::kJoin}) {
    Response r = Allreduce(std::string(OpTypeName(op)), 4);
    r.op = op;
    in.push_back(r);
  }
  Response bad = Allreduce("bad", 4);
  bad.error_code = StatusCode::kPreconditionError;
  bad.error_message = "Mismatched shapes";
  in.push_back(bad);
  in.push_back(Allreduce("a1", 4));
  const auto batches = Plan(in, Settings(1 << 20));
  ASSERT_EQ(batches.size(), in.size() - 1);  // a0 and a1 share the first batch
  EXPECT_EQ(Names(batches)[0], (std::vector<std::string>{"a0", "a1"}));
  for (size_t b = 1; b < batches.size(); ++b) EXPECT_FALSE(batches[b].fused);
  const Batch& err = batches.back();
  EXPECT_EQ(err.items[0].response->name, "bad");
  EXPECT_EQ(err.error_code, bad.error_code);
  EXPECT_EQ(err.error_message, bad.error_message);
}

// Groups fuse with everything by default; with HOROVOD_DISABLE_GROUP_FUSION a group's members fuse
// only with each other (ungrouped tensors still fuse together).
TEST(FusionPlanner, GroupsAndDisableGroupFusion) {
  std::vector<Response> in;
  auto add = [&](const std::string& name, const std::string& group, int size) {
    Response r = Allreduce(name, 4);
    r.group = group;
    r.group_size = size;
    in.push_back(r);
  };
  add("u0", "", 0);
  add("g0", "g", 2);
  add("h0", "h", 2);
  add("u1", "", 0);
  add("g1", "g", 2);
  add("h1", "h", 2);
  add("solo", "solo", 1);  // a group of one is not a group
  for (bool disable : {false, true}) {
    Config c = Settings(1 << 20);
    c.disable_group_fusion = disable;
    const auto names = Names(Plan(in, c));
    if (!disable) {
      ASSERT_EQ(names.size(), 1u);
      EXPECT_EQ(names[0].size(), in.size());
    } else {
      const std::vector<std::vector<std::string>> want = {
          {"u0", "u1", "solo"}, {"g0", "g1"}, {"h0", "h1"}};
      EXPECT_EQ(names, want);
    }
  }
}

// A joined rank has no entry for some items: they are planned like any other.
TEST(FusionPlanner, ItemsWithoutAnEntryArePlannedToo) {
  Ready ready;
  ready.push_back(BatchItem{std::make_shared<const Response>(Allreduce("mine", 4)),
                            std::make_shared<TensorEntry>()});
  ready.push_back(BatchItem{std::make_shared<const Response>(Allreduce("zeros", 4)), nullptr});
  const auto batches = PlanBatches(std::move(ready), Settings(4096), 2);
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].items.size(), 2u);
  EXPECT_NE(batches[0].items[0].entry, nullptr);
  EXPECT_EQ(batches[0].items[1].entry, nullptr);
}

}  // namespace
}  // namespace hvdc

// The NCCL backend through the public C API, on device memory, at np=1 without a launcher: every
// collective, every NCCL dtype, every reduce op, fused and zero-copy allreduce, pre/postscale,
// many tensors in flight (asynchronous completion). Expected values come from the host kernels
// (cpu::ScaleCopy): on one rank a reduction is its input, scaled.
//
// Without a GPU (CI) the device tests skip with the reason, and what needs no GPU still runs: the
// build reports NCCL's version, the backend accepts device batches only, and a device tensor
// fails with a clear CUDA error instead of hanging.
#include "ops/nccl/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/batch.h"
#include "core/c_api.h"
#include "ops/cpu/kernels.h"
#include "tests/cpp/util/nccl_test_util.h"

namespace hvdc_test {
namespace {

const auto* const kShutdown = ::testing::AddGlobalTestEnvironment(new ShutdownAtExit);

const int kNcclTypes[] = {HVDC_FLOAT16, HVDC_BFLOAT16, HVDC_FLOAT32, HVDC_FLOAT64,
                          HVDC_INT32,   HVDC_INT64,    HVDC_UINT8,   HVDC_INT8};

// ---- no GPU needed ----

TEST(NcclBuild, ReportsNcclVersion) {
  EXPECT_EQ(hvdc_nccl_built(), NCCL_VERSION_CODE);
  EXPECT_EQ(hvdc_cuda_built(), 1);
}

TEST(NcclBuild, AcceptsDeviceBatchesOnly) {
  auto backend = hvdc::MakeNcclBackend();
  hvdc::Batch b;
  b.device = -1;
  EXPECT_FALSE(backend->Accepts(b));
  b.device = 0;
  for (auto op : {hvdc::OpType::kAllreduce, hvdc::OpType::kAllgather, hvdc::OpType::kBroadcast,
                  hvdc::OpType::kAlltoall, hvdc::OpType::kReducescatter}) {
    b.op = op;
    EXPECT_TRUE(backend->Accepts(b)) << hvdc::OpTypeName(op);
  }
  b.op = hvdc::OpType::kBarrier;
  EXPECT_FALSE(backend->Accepts(b));
}

// Without a GPU a device tensor fails with the CUDA (or NCCL) error, through the callback.
TEST(NcclBuild, DeviceTensorWithoutGpuFailsClearly) {
  if (NoGpuReason().empty()) GTEST_SKIP() << "a GPU is present: covered by the device tests";
  EnsureUp();
  float dummy[4] = {1, 2, 3, 4};  // never read: the backend fails before touching data
  hvdc_request r =
      Request(HVDC_OP_ALLREDUCE, "nogpu.allreduce", DeviceTensor(HVDC_FLOAT32, {4}, dummy));
  r.output = r.input;
  r.reduce_op = HVDC_SUM;
  Result res;
  ASSERT_TRUE(Enqueue(r).WaitFor(std::chrono::seconds(120), &res)) << "no callback: hung";
  EXPECT_NE(res.code, HVDC_OK);
  EXPECT_TRUE(res.message.find("cuda") != std::string::npos ||
              res.message.find("nccl") != std::string::npos)
      << res;
  // The runtime keeps working for host tensors.
  Buffer host(HVDC_FLOAT32, 3, [](int64_t i) { return static_cast<double>(i); });
  hvdc_request h = Request(HVDC_OP_ALLREDUCE, "nogpu.host", TensorOf(host, {3}));
  h.output = h.input;
  h.reduce_op = HVDC_SUM;
  EXPECT_TRUE(RunSync(h).ok());
}

// ---- on a GPU ----

// Three tensors of one group (fused) plus one above HVDC_ZERO_COPY_BYTES (reduced in place from
// its own memory), for every NCCL dtype and reduce op, with pre/postscale.
TEST(NcclDevice, AllreduceEveryDtypeAndOp) {
  SKIP_WITHOUT_GPU();
  EnsureUp();
  const std::vector<int64_t> sizes = {1, 1000, 4099, (2 << 20) + 3};
  int serial = 0;
  for (int dtype : kNcclTypes) {
    for (int op : {HVDC_SUM, HVDC_AVERAGE, HVDC_MIN, HVDC_MAX, HVDC_PRODUCT}) {
      for (double pre : {1.0, 0.5}) {
        const double post = pre == 1.0 ? 1.0 : 4.0;
        SCOPED_TRACE(std::string(DtypeName(dtype)) + " " + ReduceOpName(op) + " pre " +
                     std::to_string(pre));
        std::vector<std::vector<uint8_t>> in;
        std::vector<std::unique_ptr<DeviceBuffer>> din, dout;
        std::vector<std::string> names;
        std::vector<hvdc_request> reqs;
        for (size_t k = 0; k < sizes.size(); ++k) {
          in.push_back(Values(dtype, sizes[k], static_cast<int>(k)));
          din.push_back(std::make_unique<DeviceBuffer>(in.back()));
          dout.push_back(std::make_unique<DeviceBuffer>(in.back().size()));
          names.push_back("ar." + std::to_string(serial++));
        }
        for (size_t k = 0; k < sizes.size(); ++k) {
          hvdc_request r = Request(HVDC_OP_ALLREDUCE, names[k].c_str(),
                                   DeviceTensor(dtype, {sizes[k]}, din[k]->get()));
          r.output = DeviceTensor(dtype, {sizes[k]}, dout[k]->get());
          r.reduce_op = op;
          r.prescale_factor = pre;
          r.postscale_factor = post;
          reqs.push_back(r);
        }
        // The first three as one group (fused), the large one on its own.
        Pending group = Enqueue(reqs.data(), 3);
        Pending large = Enqueue(reqs[3]);
        const Result g = group.Wait();
        const Result l = large.Wait();
        ASSERT_TRUE(g.ok()) << g;
        ASSERT_TRUE(l.ok()) << l;
        for (size_t k = 0; k < sizes.size(); ++k) {
          ASSERT_EQ(dout[k]->Read(), Scaled(in[k], dtype, pre, post)) << "tensor " << k;
        }
      }
    }
  }
}

TEST(NcclDevice, AllreduceInPlace) {
  SKIP_WITHOUT_GPU();
  EnsureUp();
  for (int64_t n : {int64_t{7}, int64_t{(1 << 20) + 1}}) {
    const auto in = Values(HVDC_FLOAT32, n, 3);
    DeviceBuffer buf(in);
    hvdc_request r =
        Request(HVDC_OP_ALLREDUCE, "ar.inplace", DeviceTensor(HVDC_FLOAT32, {n}, buf.get()));
    r.output = r.input;
    r.reduce_op = HVDC_SUM;
    r.postscale_factor = 0.5;
    const Result res = RunSync(r);
    ASSERT_TRUE(res.ok()) << res;
    EXPECT_EQ(buf.Read(), Scaled(in, HVDC_FLOAT32, 1.0, 0.5));
  }
}

// Many tensors in flight at once: completion order and the completion thread under load.
TEST(NcclDevice, ManyInFlight) {
  SKIP_WITHOUT_GPU();
  EnsureUp();
  const int kCount = 300;
  std::vector<std::vector<uint8_t>> in;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  std::vector<std::string> names;
  std::vector<Pending> pending;
  for (int i = 0; i < kCount; ++i) {
    in.push_back(Values(HVDC_FLOAT32, 1 + (i * 131) % 5000, i));
    bufs.push_back(std::make_unique<DeviceBuffer>(in.back()));
    names.push_back("flight." + std::to_string(i));
  }
  for (int i = 0; i < kCount; ++i) {
    const int64_t n = static_cast<int64_t>(in[i].size() / 4);
    hvdc_request r = Request(HVDC_OP_ALLREDUCE, names[i].c_str(),
                             DeviceTensor(HVDC_FLOAT32, {n}, bufs[i]->get()));
    r.output = r.input;
    r.reduce_op = HVDC_AVERAGE;
    pending.push_back(Enqueue(r));
  }
  for (int i = 0; i < kCount; ++i) {
    const Result res = pending[i].Wait();
    ASSERT_TRUE(res.ok()) << res;
    ASSERT_EQ(bufs[i]->Read(), in[i]) << names[i];
  }
}

TEST(NcclDevice, Allgather) {
  SKIP_WITHOUT_GPU();
  EnsureUp();
  for (int dtype : {HVDC_FLOAT32, HVDC_INT64, HVDC_BOOL, HVDC_UINT16}) {
    const auto in = Values(dtype == HVDC_BOOL ? HVDC_UINT8 : dtype, 5 * 3, 1);
    DeviceBuffer din(in);
    DeviceOutput out;
    out.dtype = dtype;
    hvdc_request r = Request(HVDC_OP_ALLGATHER, "ag", DeviceTensor(dtype, {5, 3}, din.get()));
    r.allocate = &DeviceOutput::Allocate;
    r.allocate_user = &out;
    const Result res = RunSync(r);
    ASSERT_TRUE(res.ok()) << res;
    EXPECT_EQ(out.dims, (std::vector<int64_t>{5, 3}));
    EXPECT_EQ(out.buf->Read(), in) << DtypeName(dtype);
  }
}

TEST(NcclDevice, Broadcast) {
  SKIP_WITHOUT_GPU();
  EnsureUp();
  const auto in = Values(HVDC_FLOAT64, 1001, 2);
  DeviceBuffer din(in);
  DeviceBuffer dout(in.size());
  hvdc_request r = Request(HVDC_OP_BROADCAST, "bc", DeviceTensor(HVDC_FLOAT64, {1001}, din.get()));
  r.output = DeviceTensor(HVDC_FLOAT64, {1001}, dout.get());
  r.root_rank = 0;
  const Result res = RunSync(r);
  ASSERT_TRUE(res.ok()) << res;
  EXPECT_EQ(dout.Read(), in);
}

TEST(NcclDevice, AlltoallWithSplits) {
  SKIP_WITHOUT_GPU();
  EnsureUp();
  const auto in = Values(HVDC_INT32, 6 * 4, 5);
  DeviceBuffer din(in);
  DeviceOutput out;
  out.dtype = HVDC_INT32;
  const int32_t splits[1] = {6};
  int32_t received[1] = {-1};
  hvdc_request r = Request(HVDC_OP_ALLTOALL, "a2a", DeviceTensor(HVDC_INT32, {6, 4}, din.get()));
  r.splits = splits;
  r.num_splits = 1;
  r.received_splits = received;
  r.allocate = &DeviceOutput::Allocate;
  r.allocate_user = &out;
  const Result res = RunSync(r);
  ASSERT_TRUE(res.ok()) << res;
  EXPECT_EQ(received[0], 6);
  EXPECT_EQ(out.dims, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(out.buf->Read(), in);
}

TEST(NcclDevice, ReducescatterScaled) {
  SKIP_WITHOUT_GPU();
  EnsureUp();
  for (int dtype : kNcclTypes) {
    const auto in = Values(dtype, 9 * 5, 4);
    DeviceBuffer din(in);
    DeviceOutput out;
    out.dtype = dtype;
    hvdc_request r = Request(HVDC_OP_REDUCESCATTER, "rs", DeviceTensor(dtype, {9, 5}, din.get()));
    r.reduce_op = HVDC_SUM;
    r.prescale_factor = 2.0;
    r.postscale_factor = 0.5;
    r.allocate = &DeviceOutput::Allocate;
    r.allocate_user = &out;
    const Result res = RunSync(r);
    ASSERT_TRUE(res.ok()) << res;
    EXPECT_EQ(out.dims, (std::vector<int64_t>{9, 5}));
    EXPECT_EQ(out.buf->Read(), Scaled(in, dtype, 2.0, 0.5)) << DtypeName(dtype);
  }
}

// A reduction NCCL cannot do fails that tensor with a message, and the runtime goes on.
TEST(NcclDevice, UnsupportedReductionTypeFails) {
  SKIP_WITHOUT_GPU();
  EnsureUp();
  DeviceBuffer buf(16);
  hvdc_request r =
      Request(HVDC_OP_ALLREDUCE, "ar.uint16", DeviceTensor(HVDC_UINT16, {8}, buf.get()));
  r.output = r.input;
  r.reduce_op = HVDC_SUM;
  const Result res = RunSync(r);
  EXPECT_FALSE(res.ok());
  EXPECT_NE(res.message.find("not supported"), std::string::npos) << res;
  const auto in = Values(HVDC_FLOAT32, 3, 0);
  DeviceBuffer ok(in);
  hvdc_request r2 =
      Request(HVDC_OP_ALLREDUCE, "ar.after", DeviceTensor(HVDC_FLOAT32, {3}, ok.get()));
  r2.output = r2.input;
  r2.reduce_op = HVDC_SUM;
  EXPECT_TRUE(RunSync(r2).ok());
}

}  // namespace
}  // namespace hvdc_test

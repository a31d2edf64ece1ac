// GPU work that never finishes is not waited for forever: with HOROVOD_STALL_SHUTDOWN_TIME_SECONDS
// set, the NCCL backend's completion thread aborts the communicator and fails the work with a
// message naming the tensor, and later work on the set fails at once instead of hanging. Here the
// stall is a producer's ready_event held back by a StreamGate (across ranks it would be a member
// that failed before its collective). Its own binary: the aborted communicator stays broken for
// the rest of the process. Without a GPU it skips with the reason.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/c_api.h"
#include "tests/cpp/util/nccl_test_util.h"

namespace hvdc_test {
namespace {

const auto* const kShutdown = ::testing::AddGlobalTestEnvironment(new ShutdownAtExit);

hvdc_request DeviceAllreduce(const char* name, const DeviceBuffer& buf, int64_t count) {
  hvdc_request r = Request(HVDC_OP_ALLREDUCE, name, DeviceTensor(HVDC_FLOAT32, {count}, buf.get()));
  r.output = r.input;
  r.reduce_op = HVDC_SUM;
  return r;
}

TEST(NcclStall, StalledWorkIsAbortedWithAClearError) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(hvdc_is_initialized(), 0);
  setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "1", 1);
  setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "2", 1);
  EnsureUp();
  const int64_t count = 1000;
  DeviceBuffer buf(Values(HVDC_FLOAT32, count, 3));
  // The communicator exists and works before the stall.
  ASSERT_TRUE(RunSync(DeviceAllreduce("stall.warmup", buf, count)).ok());

  cudaStream_t producer = nullptr;
  cudaEvent_t ready = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  StreamGate gate(std::chrono::seconds(40));
  ASSERT_CUDA(gate.Hold(producer));
  ASSERT_CUDA(cudaEventRecord(ready, producer));
  hvdc_request r = DeviceAllreduce("stall.held", buf, count);
  r.ready_event = ready;
  const auto start = std::chrono::steady_clock::now();
  Result res;
  const bool called = Enqueue(r).WaitFor(std::chrono::seconds(30), &res);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  gate.Open();
  ASSERT_CUDA(cudaStreamSynchronize(producer));
  cudaEventDestroy(ready);
  cudaStreamDestroy(producer);
  ASSERT_TRUE(called) << "no callback 30 s into a stall with a 2 s shutdown limit";
  EXPECT_FALSE(gate.timed_out());
  EXPECT_GE(waited, 1.5);
  EXPECT_EQ(res.code, HVDC_ABORTED) << res;
  EXPECT_NE(res.message.find("stall.held"), std::string::npos) << res;
  EXPECT_NE(res.message.find("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"), std::string::npos) << res;

  // The aborted communicator fails later device work at once, with the reason.
  Result later;
  ASSERT_TRUE(
      Enqueue(DeviceAllreduce("stall.after", buf, count)).WaitFor(std::chrono::seconds(30), &later))
      << "device work after the abort hung";
  EXPECT_NE(later.code, HVDC_OK);
  EXPECT_NE(later.message.find("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"), std::string::npos) << later;
  // Host tensors are unaffected.
  Buffer host(HVDC_FLOAT32, 3, [](int64_t i) { return static_cast<double>(i); });
  hvdc_request h = Request(HVDC_OP_ALLREDUCE, "stall.host", TensorOf(host, {3}));
  h.output = h.input;
  h.reduce_op = HVDC_SUM;
  EXPECT_TRUE(RunSync(h).ok());
}

}  // namespace
}  // namespace hvdc_test

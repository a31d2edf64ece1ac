// hvdc_request's ready_event and done_stream on a GPU, at np=1 without a launcher. The producer's
// stream is held by a StreamGate until the test opens it, with the input written behind the gate:
// - ready_event: the backend's stream waits for the producer's event, so the caller needs no host
//   synchronisation before hvdc_enqueue, and (without a done_stream) the callback waits too;
// - done_stream: the callback comes as soon as the work is queued, while the gate is still shut,
//   and work the caller then queues on its stream still sees the result.
// Both the fused path (small tensors) and the zero-copy path (a tensor above HVDC_ZERO_COPY_BYTES).
// Without a GPU every test skips with the reason.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/c_api.h"
#include "tests/cpp/util/nccl_test_util.h"

namespace hvdc_test {
namespace {

const auto* const kShutdown = ::testing::AddGlobalTestEnvironment(new ShutdownAtExit);

// Small (fused) and large (reduced from its own memory) element counts.
const int64_t kCounts[] = {1000, (1 << 20) + 3};

// Pinned host memory, so copies from and to it are asynchronous on their stream.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(const std::vector<uint8_t>& bytes) : bytes_(bytes.size()) {
    EXPECT_EQ(cudaMallocHost(&ptr_, bytes_), cudaSuccess);
    std::memcpy(ptr_, bytes.data(), bytes_);
  }
  ~PinnedBuffer() { cudaFreeHost(ptr_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return ptr_; }
  std::vector<uint8_t> Bytes() const {
    const auto* p = static_cast<const uint8_t*>(ptr_);
    return std::vector<uint8_t>(p, p + bytes_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A stream and an event that destroy themselves.
struct StreamAndEvent {
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  StreamAndEvent() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), cudaSuccess);
  }
  ~StreamAndEvent() {
    cudaStreamSynchronize(stream);
    cudaEventDestroy(event);
    cudaStreamDestroy(stream);
  }
};

// One allreduce (Sum, postscale 2) whose input the producer writes behind a shut gate.
struct GatedAllreduce {
  std::vector<uint8_t> stale;  // the device input before the producer's copy lands
  std::vector<uint8_t> fresh;  // what the producer writes
  DeviceBuffer input;
  DeviceBuffer output;
  PinnedBuffer source;
  std::string name;
  explicit GatedAllreduce(int64_t count, const std::string& tag)
      : stale(Values(HVDC_FLOAT32, count, 5)),
        fresh(Values(HVDC_FLOAT32, count, 11)),
        input(stale),
        output(stale.size()),
        source(fresh),
        name(tag + "." + std::to_string(count)) {}
  std::vector<uint8_t> Expected() const { return Scaled(fresh, HVDC_FLOAT32, 1.0, 2.0); }
  hvdc_request Make(cudaEvent_t ready, cudaStream_t done_stream) const {
    const int64_t count = static_cast<int64_t>(fresh.size() / 4);
    hvdc_request r =
        Request(HVDC_OP_ALLREDUCE, name.c_str(), DeviceTensor(HVDC_FLOAT32, {count}, input.get()));
    r.output = DeviceTensor(HVDC_FLOAT32, {count}, output.get());
    r.reduce_op = HVDC_SUM;
    r.postscale_factor = 2.0;
    r.ready_event = ready;
    r.done_stream = done_stream;
    return r;
  }
};

// Holds the producer's stream behind `gate`, writes the tensors' inputs behind it, and records
// the producer's event after them.
void ProduceBehindGate(StreamGate& gate, const StreamAndEvent& producer,
                       std::initializer_list<const GatedAllreduce*> tensors) {
  ASSERT_CUDA(gate.Hold(producer.stream));
  for (const GatedAllreduce* t : tensors) {
    ASSERT_CUDA(cudaMemcpyAsync(t->input.get(), t->source.get(), t->fresh.size(),
                                cudaMemcpyHostToDevice, producer.stream));
  }
  ASSERT_CUDA(cudaEventRecord(producer.event, producer.stream));
}

TEST(NcclStream, ReadyEventOrdersTheInput) {
  SKIP_WITHOUT_GPU();
  EnsureUp();
  for (int64_t count : kCounts) {
    SCOPED_TRACE(count);
    GatedAllreduce t(count, "stream.ready");
    StreamAndEvent producer;
    StreamGate gate;
    ASSERT_NO_FATAL_FAILURE(ProduceBehindGate(gate, producer, {&t}));
    const hvdc_request r = t.Make(producer.event, nullptr);
    Pending pending = Enqueue(r);
    // Without a done_stream the callback means "finished on the GPU": not before the gate opens.
    Result early;
    EXPECT_FALSE(pending.WaitFor(std::chrono::milliseconds(300), &early))
        << "the callback came while the input was still being produced: " << early;
    gate.Open();
    const Result res = pending.Wait();
    ASSERT_CUDA(cudaStreamSynchronize(producer.stream));
    EXPECT_FALSE(gate.timed_out());
    ASSERT_TRUE(res.ok()) << res;
    EXPECT_EQ(t.output.Read(), t.Expected()) << "the reduction read the input before it was ready";
  }
}

TEST(NcclStream, DoneStreamReleasesTheCallerBeforeTheGpuFinishes) {
  SKIP_WITHOUT_GPU();
  EnsureUp();
  for (int64_t count : kCounts) {
    SCOPED_TRACE(count);
    GatedAllreduce t(count, "stream.done");
    StreamAndEvent producer;
    StreamAndEvent consumer;
    StreamGate gate;
    ASSERT_NO_FATAL_FAILURE(ProduceBehindGate(gate, producer, {&t}));
    const hvdc_request r = t.Make(producer.event, consumer.stream);
    Pending pending = Enqueue(r);
    // The callback comes once the work is queued, although the GPU cannot have run it yet.
    Result res;
    ASSERT_TRUE(pending.WaitFor(std::chrono::seconds(30), &res))
        << "no callback while the producer was held: done_stream did not release the caller";
    ASSERT_TRUE(res.ok()) << res;
    // The consumer's later work is ordered after the reduction.
    PinnedBuffer result(std::vector<uint8_t>(t.fresh.size(), 0));
    ASSERT_CUDA(cudaMemcpyAsync(result.get(), t.output.get(), t.fresh.size(),
                                cudaMemcpyDeviceToHost, consumer.stream));
    EXPECT_EQ(cudaStreamQuery(consumer.stream), cudaErrorNotReady)
        << "the consumer's copy ran before the producer was released";
    gate.Open();
    ASSERT_CUDA(cudaStreamSynchronize(consumer.stream));
    ASSERT_CUDA(cudaStreamSynchronize(producer.stream));
    EXPECT_FALSE(gate.timed_out());
    EXPECT_EQ(result.Bytes(), t.Expected()) << "the consumer's stream did not wait for the result";
  }
}

// A group whose members mix both: the callback (once, for the group) waits for the member
// without a done_stream.
TEST(NcclStream, GroupWithAndWithoutDoneStream) {
  SKIP_WITHOUT_GPU();
  EnsureUp();
  GatedAllreduce a(257, "stream.group_a");
  GatedAllreduce b(513, "stream.group_b");
  StreamAndEvent producer;
  StreamAndEvent consumer;
  StreamGate gate;
  ASSERT_NO_FATAL_FAILURE(ProduceBehindGate(gate, producer, {&a, &b}));
  const hvdc_request reqs[2] = {a.Make(producer.event, consumer.stream),
                                b.Make(producer.event, nullptr)};
  Pending pending = Enqueue(reqs, 2);
  Result early;
  EXPECT_FALSE(pending.WaitFor(std::chrono::milliseconds(300), &early))
      << "the group completed before its member without a done_stream finished: " << early;
  gate.Open();
  const Result res = pending.Wait();
  ASSERT_CUDA(cudaStreamSynchronize(producer.stream));
  ASSERT_CUDA(cudaStreamSynchronize(consumer.stream));
  ASSERT_TRUE(res.ok()) << res;
  EXPECT_EQ(a.output.Read(), a.Expected());
  EXPECT_EQ(b.output.Read(), b.Expected());
}

}  // namespace
}  // namespace hvdc_test

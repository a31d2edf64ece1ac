// What the NCCL suites share: device tensors and requests through the public C API at np=1,
// reference values from the host kernels, and a runtime shut down when the binary ends (each
// suite registers ShutdownAtExit once).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/c_api.h"
#include "core/types.h"
#include "ops/cpu/kernels.h"
#include "tests/cpp/util/c_api_harness.h"
#include "tests/cpp/util/cuda_test_util.h"

namespace hvdc_test {

inline void EnsureUp() {
  if (hvdc_is_initialized() != 1) {
    ASSERT_EQ(hvdc_init(nullptr), HVDC_OK) << hvdc_last_error();
  }
}

class ShutdownAtExit : public ::testing::Environment {
 public:
  void TearDown() override {
    if (hvdc_is_initialized() == 1) {
      EXPECT_EQ(hvdc_shutdown(), HVDC_OK) << hvdc_last_error();
    }
  }
};

inline hvdc::DataType Dt(int dtype) { return static_cast<hvdc::DataType>(dtype); }

// Host bytes of n elements: small values of both signs (fractions for floating point).
inline std::vector<uint8_t> Values(int dtype, int64_t n, int salt) {
  Buffer b(dtype, n, [&](int64_t i) {
    double v = static_cast<double>((i * 7 + salt) % 23) - 11;
    if (IsFloat(dtype)) v += 0.25;
    if (!IsSigned(dtype) && !IsFloat(dtype)) v = v < 0 ? -v : v;
    return v;
  });
  const auto* p = static_cast<const uint8_t*>(b.data());
  return std::vector<uint8_t>(p, p + n * static_cast<int64_t>(DtypeSize(dtype)));
}

// An output the runtime allocates (allgather, alltoall, reducescatter) in device memory.
struct DeviceOutput {
  int dtype = HVDC_FLOAT32;
  std::vector<int64_t> dims;
  std::unique_ptr<DeviceBuffer> buf;
  static void* Allocate(void* user, int32_t ndim, const int64_t* dims) {
    auto* o = static_cast<DeviceOutput*>(user);
    o->dims.assign(dims, dims + ndim);
    o->buf = std::make_unique<DeviceBuffer>(static_cast<size_t>(NumElements(o->dims)) *
                                            DtypeSize(o->dtype));
    return o->buf->get();
  }
};

inline hvdc_tensor DeviceTensor(int dtype, const std::vector<int64_t>& dims, void* data) {
  hvdc_tensor t = MakeTensor(dtype, dims, data);
  t.device = 0;
  return t;
}

inline hvdc_request Request(int op, const char* name, const hvdc_tensor& in) {
  hvdc_request r;
  std::memset(&r, 0, sizeof r);
  r.op = op;
  r.name = name;
  r.input = in;
  return r;
}

inline std::vector<uint8_t> Scaled(const std::vector<uint8_t>& in, int dtype, double pre,
                                   double post) {
  std::vector<uint8_t> out(in.size());
  const int64_t n = static_cast<int64_t>(in.size() / DtypeSize(dtype));
  hvdc::cpu::ScaleCopy(out.data(), in.data(), n, Dt(dtype), pre);
  hvdc::cpu::ScaleCopy(out.data(), out.data(), n, Dt(dtype), post);
  return out;
}

// Holds a CUDA stream (through cudaLaunchHostFunc) until Open() -- or until `limit` has passed,
// so a test that fails never leaves the stream blocked. Work queued behind the gate on that stream
// cannot have run before Open(): an ordering bug reads stale data instead of passing by luck.
class StreamGate {
 public:
  explicit StreamGate(std::chrono::seconds limit = std::chrono::seconds(60)) : limit_(limit) {}
  ~StreamGate() { Open(); }
  cudaError_t Hold(cudaStream_t stream) {
    return cudaLaunchHostFunc(stream, &StreamGate::Run, this);
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Whether the gate opened by itself (the limit passed before Open()).
  bool timed_out() const {
    std::lock_guard<std::mutex> lock(mu_);
    return timed_out_;
  }

 private:
  static void CUDART_CB Run(void* self) {
    auto* g = static_cast<StreamGate*>(self);
    std::unique_lock<std::mutex> lock(g->mu_);
    if (!g->cv_.wait_for(lock, g->limit_, [g] { return g->open_; })) g->timed_out_ = true;
  }

  std::chrono::seconds limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  bool timed_out_ = false;
};

}  // namespace hvdc_test

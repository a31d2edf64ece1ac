// gpu_bench: the GPU row of BENCHMARKS.md, on one GPU (np=1; NCCL refuses two ranks on one GPU).
//
//  1. pack/unpack: the batched copy kernel (ops/cuda) moving a tensor set into and out of a
//     contiguous fusion buffer, vs one cudaMemcpy device-to-device of the same bytes (target: the
//     kernel reaches >= 80 % of the memcpy bandwidth).
//  2. step: the ResNet-50 tensor set allreduced through the runtime (C API, one request per tensor
//     in backward order, device memory, Average) vs a hand-written step of the same work -- one
//     batched pack, ncclAllReduce, one batched unpack with the postscale -- on a private stream
//     (target: runtime <= 1.05 x hand-written; the added microseconds per step are reported).
//
// Every measurement is checked for the right values first. Usage:
//   gpu_bench [--tensors FILE] [--json FILE] [--warmup N] [--steps N]
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "core/c_api.h"
#include "ops/cuda/batched_copy.h"

namespace {

#define CHECK_CUDA(call)                                                                 \
  do {                                                                                   \
    const cudaError_t e_ = (call);                                                       \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "gpu_bench: %s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

#define CHECK_NCCL(call)                                                                 \
  do {                                                                                   \
    const ncclResult_t r_ = (call);                                                      \
    if (r_ != ncclSuccess) {                                                             \
      std::fprintf(stderr, "gpu_bench: %s failed: %s\n", #call, ncclGetErrorString(r_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "gpu_bench: %s\n", what.c_str());
  std::exit(1);
}

struct Args {
  std::string tensors = std::string(HVDC_BENCH_TENSOR_DIR) + "/resnet50_keras.txt";
  std::string json;
  int warmup = 5;
  int steps = 20;
};

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Fail("missing value after " + k);
      return argv[++i];
    };
    if (k == "--tensors") {
      a.tensors = value();
    } else if (k == "--json") {
      a.json = value();
    } else if (k == "--warmup") {
      a.warmup = std::max(1, std::atoi(value().c_str()));
    } else if (k == "--steps") {
      a.steps = std::max(1, std::atoi(value().c_str()));
    } else {
      Fail("unknown argument " + k + " (see the comment at the top of bench/gpu_bench.cc)");
    }
  }
  return a;
}

// Element counts (float32), one per line; '#' starts a comment.
std::vector<int64_t> ReadTensorSet(const std::string& path) {
  std::ifstream in(path);
  if (!in) Fail("cannot read " + path);
  std::vector<int64_t> counts;
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream ss(line);
    int64_t n;
    if (ss >> n) counts.push_back(n);
  }
  if (counts.empty()) Fail(path + " lists no tensors");
  return counts;
}

struct Stats {
  double median = 0;
  double p90 = 0;
};

Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  s.median = v[v.size() / 2];
  s.p90 = v[std::min(v.size() - 1, v.size() * 9 / 10)];
  return s;
}

int64_t AlignUp(int64_t n) { return (n + 255) / 256 * 256; }

// Device tensors of a set and a fusion buffer laid out like the runtime's (256-byte slots).
struct DeviceSet {
  std::vector<float*> tensors;
  std::vector<int64_t> counts;
  std::vector<int64_t> offsets;  // bytes into the fusion buffer
  int64_t bytes = 0;             // payload
  int64_t buffer_bytes = 0;      // with padding
  uint8_t* buffer = nullptr;

  explicit DeviceSet(const std::vector<int64_t>& c) : counts(c) {
    for (int64_t n : counts) {
      float* p = nullptr;
      CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), static_cast<size_t>(n) * 4));
      tensors.push_back(p);
      offsets.push_back(buffer_bytes);
      bytes += n * 4;
      buffer_bytes += AlignUp(n * 4);
    }
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&buffer), static_cast<size_t>(buffer_bytes)));
  }
  ~DeviceSet() {
    for (float* p : tensors) cudaFree(p);
    cudaFree(buffer);
  }
  DeviceSet(const DeviceSet&) = delete;
  DeviceSet& operator=(const DeviceSet&) = delete;

  void Fill(float v) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::vector<float> host(static_cast<size_t>(counts[i]), v);
      CHECK_CUDA(cudaMemcpy(tensors[i], host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    }
  }
  // Every element of every tensor equals v (checks the first, middle and last of each).
  bool AllEqual(float v) const {
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (int64_t at : {int64_t{0}, counts[i] / 2, counts[i] - 1}) {
        float got = 0;
        CHECK_CUDA(cudaMemcpy(&got, tensors[i] + at, 4, cudaMemcpyDeviceToHost));
        if (got != v) {
          std::fprintf(stderr, "gpu_bench: tensor %zu element %lld is %g, expected %g\n", i,
                       static_cast<long long>(at), got, v);
          return false;
        }
      }
    }
    return true;
  }
  std::vector<hvdc::cuda::CopySegment> Pack() const {
    std::vector<hvdc::cuda::CopySegment> s;
    for (size_t i = 0; i < tensors.size(); ++i) {
      s.push_back({tensors[i], buffer + offsets[i], counts[i] * 4});
    }
    return s;
  }
  std::vector<hvdc::cuda::CopySegment> Unpack() const {
    std::vector<hvdc::cuda::CopySegment> s;
    for (size_t i = 0; i < tensors.size(); ++i) {
      s.push_back({buffer + offsets[i], tensors[i], counts[i] * 4});
    }
    return s;
  }
};

// ---- 1. pack/unpack bandwidth ----

struct CopyResult {
  std::string set;
  int64_t tensors = 0;
  int64_t bytes = 0;
  double pack_gbs = 0, unpack_gbs = 0, pack_scaled_gbs = 0, memcpy_gbs = 0;
};

// Median GB/s of `op` (queued on `stream`) timed with events.
template <typename F>
double Bandwidth(int64_t bytes, const Args& a, cudaStream_t stream, F op) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < a.warmup; ++i) op();
  std::vector<double> gbs;
  for (int i = 0; i < a.steps; ++i) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    op();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    gbs.push_back(static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return Summarize(gbs).median;
}

CopyResult MeasureCopies(const std::string& name, const std::vector<int64_t>& counts, const Args& a,
                         cudaStream_t stream) {
  DeviceSet set(counts);
  set.Fill(3.0f);
  const auto pack = set.Pack();
  const auto unpack = set.Unpack();
  // Correctness first: pack x0.5, unpack x4 gives 6 everywhere.
  CHECK_CUDA(hvdc::cuda::BatchedCopy(pack.data(), static_cast<int>(pack.size()),
                                     hvdc::DataType::kFloat32, 0.5, stream));
  CHECK_CUDA(hvdc::cuda::BatchedCopy(unpack.data(), static_cast<int>(unpack.size()),
                                     hvdc::DataType::kFloat32, 4.0, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  if (!set.AllEqual(6.0f)) Fail("pack/unpack produced wrong values for " + name);

  uint8_t* contiguous = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&contiguous), static_cast<size_t>(set.bytes)));
  CopyResult r;
  r.set = name;
  r.tensors = static_cast<int64_t>(counts.size());
  r.bytes = set.bytes;
  r.pack_gbs = Bandwidth(set.bytes, a, stream, [&] {
    CHECK_CUDA(hvdc::cuda::BatchedCopy(pack.data(), static_cast<int>(pack.size()),
                                       hvdc::DataType::kFloat32, 1.0, stream));
  });
  r.unpack_gbs = Bandwidth(set.bytes, a, stream, [&] {
    CHECK_CUDA(hvdc::cuda::BatchedCopy(unpack.data(), static_cast<int>(unpack.size()),
                                       hvdc::DataType::kFloat32, 1.0, stream));
  });
  r.pack_scaled_gbs = Bandwidth(set.bytes, a, stream, [&] {
    CHECK_CUDA(hvdc::cuda::BatchedCopy(pack.data(), static_cast<int>(pack.size()),
                                       hvdc::DataType::kFloat32, 0.5, stream));
  });
  r.memcpy_gbs = Bandwidth(set.bytes, a, stream, [&] {
    CHECK_CUDA(cudaMemcpyAsync(set.buffer, contiguous, static_cast<size_t>(set.bytes),
                               cudaMemcpyDeviceToDevice, stream));
  });
  cudaFree(contiguous);
  return r;
}

// ---- 2. the ResNet-50 step ----

struct StepCounter {
  std::mutex mu;
  std::condition_variable cv;
  int remaining = 0;
  int failures = 0;
  std::string first_error;
};

void OnDone(void* user, int code, const char* message) {
  auto* c = static_cast<StepCounter*>(user);
  std::lock_guard<std::mutex> lock(c->mu);
  if (code != HVDC_OK && c->failures++ == 0) c->first_error = message ? message : "";
  if (--c->remaining == 0) c->cv.notify_all();
}

// One step through the runtime: every tensor enqueued (backward order = file order), in place,
// Average; returns when every callback has run.
double RuntimeStep(DeviceSet& set, const std::vector<std::string>& names) {
  StepCounter counter;
  counter.remaining = static_cast<int>(set.tensors.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < set.tensors.size(); ++i) {
    hvdc_request r;
    std::memset(&r, 0, sizeof r);
    r.op = HVDC_OP_ALLREDUCE;
    r.name = names[i].c_str();
    r.input.dtype = HVDC_FLOAT32;
    r.input.ndim = 1;
    r.input.dims[0] = set.counts[i];
    r.input.device = 0;
    r.input.data = set.tensors[i];
    r.output = r.input;
    r.reduce_op = HVDC_AVERAGE;
    if (hvdc_enqueue(&r, 1, &OnDone, &counter) != HVDC_OK) {
      Fail(std::string("hvdc_enqueue: ") + hvdc_last_error());
    }
  }
  std::unique_lock<std::mutex> lock(counter.mu);
  counter.cv.wait(lock, [&] { return counter.remaining == 0; });
  const auto t1 = std::chrono::steady_clock::now();
  if (counter.failures > 0) Fail("runtime step failed: " + counter.first_error);
  return std::chrono::duration<double>(t1 - t0).count();
}

// The same work written by hand: one pack, one allreduce, one unpack with the postscale.
double HandStep(DeviceSet& set, ncclComm_t comm, cudaStream_t stream, int size) {
  const auto pack = set.Pack();
  const auto unpack = set.Unpack();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_CUDA(hvdc::cuda::BatchedCopy(pack.data(), static_cast<int>(pack.size()),
                                     hvdc::DataType::kFloat32, 1.0, stream));
  CHECK_NCCL(ncclAllReduce(set.buffer, set.buffer, static_cast<size_t>(set.buffer_bytes / 4),
                           ncclFloat32, ncclSum, comm, stream));
  CHECK_CUDA(hvdc::cuda::BatchedCopy(unpack.data(), static_cast<int>(unpack.size()),
                                     hvdc::DataType::kFloat32, 1.0 / size, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (devices == 0) Fail("no CUDA device");
  CHECK_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const std::vector<int64_t> resnet = ReadTensorSet(args.tensors);
  std::printf("gpu_bench on %s, NCCL %d (runtime built with %d), %zu tensors from %s\n", prop.name,
              NCCL_VERSION_CODE, hvdc_nccl_built(), resnet.size(), args.tensors.c_str());
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // 1. pack/unpack bandwidth.
  std::vector<CopyResult> copies;
  copies.push_back(MeasureCopies("resnet50", resnet, args, stream));
  copies.push_back(MeasureCopies("1000x16KiB", std::vector<int64_t>(1000, 4096), args, stream));
  copies.push_back(MeasureCopies("8x16MiB", std::vector<int64_t>(8, 4 << 20), args, stream));
  std::printf("\n%-12s %8s %10s %10s %10s %12s %10s %8s\n", "set", "tensors", "MiB", "pack GB/s",
              "unpack", "pack x0.5", "memcpy", "pack/cp");
  for (const auto& r : copies) {
    std::printf("%-12s %8lld %10.1f %10.1f %10.1f %12.1f %10.1f %7.0f%%\n", r.set.c_str(),
                static_cast<long long>(r.tensors), static_cast<double>(r.bytes) / (1 << 20),
                r.pack_gbs, r.unpack_gbs, r.pack_scaled_gbs, r.memcpy_gbs,
                100.0 * r.pack_gbs / r.memcpy_gbs);
  }

  // 2. ResNet-50 step: the runtime vs by hand, alternating steps so drift hits both alike.
  if (hvdc_init(nullptr) != HVDC_OK) Fail(std::string("hvdc_init: ") + hvdc_last_error());
  const int size = hvdc_size();
  ncclUniqueId id;
  ncclComm_t comm;
  CHECK_NCCL(ncclGetUniqueId(&id));
  CHECK_NCCL(ncclCommInitRank(&comm, 1, id, 0));
  DeviceSet set(resnet);
  std::vector<std::string> names;
  for (size_t i = 0; i < resnet.size(); ++i) names.push_back("grad." + std::to_string(i));
  set.Fill(2.0f);
  for (int i = 0; i < args.warmup; ++i) {
    RuntimeStep(set, names);
    HandStep(set, comm, stream, 1);
  }
  if (!set.AllEqual(2.0f)) Fail("the step changed the values (np=1 Average must keep them)");
  std::vector<double> ours, hand;
  for (int i = 0; i < args.steps; ++i) {
    ours.push_back(RuntimeStep(set, names));
    hand.push_back(HandStep(set, comm, stream, 1));
  }
  if (!set.AllEqual(2.0f)) Fail("wrong values after the measured steps");
  const Stats o = Summarize(ours);
  const Stats h = Summarize(hand);
  std::printf("\nResNet-50 step (%zu tensors, %.1f MiB, np=%d)\n", resnet.size(),
              static_cast<double>(set.bytes) / (1 << 20), size);
  std::printf("  runtime      median %8.1f us  p90 %8.1f us\n", o.median * 1e6, o.p90 * 1e6);
  std::printf("  hand-written median %8.1f us  p90 %8.1f us\n", h.median * 1e6, h.p90 * 1e6);
  std::printf("  ratio %.3f (target <= 1.05), added %.1f us per step\n", o.median / h.median,
              (o.median - h.median) * 1e6);
  ncclCommDestroy(comm);
  hvdc_shutdown();

  if (!args.json.empty()) {
    std::ofstream out(args.json);
    out << "{\n  \"device\": \"" << prop.name << "\",\n  \"nccl\": " << NCCL_VERSION_CODE
        << ",\n  \"copies\": [\n";
    for (size_t i = 0; i < copies.size(); ++i) {
      const auto& r = copies[i];
      out << "    {\"set\": \"" << r.set << "\", \"tensors\": " << r.tensors
          << ", \"bytes\": " << r.bytes << ", \"pack_gbs\": " << r.pack_gbs
          << ", \"unpack_gbs\": " << r.unpack_gbs << ", \"pack_scaled_gbs\": " << r.pack_scaled_gbs
          << ", \"memcpy_gbs\": " << r.memcpy_gbs << "}" << (i + 1 < copies.size() ? "," : "")
          << "\n";
    }
    out << "  ],\n  \"resnet50_step\": {\"tensors\": " << resnet.size()
        << ", \"bytes\": " << set.bytes << ", \"runtime_median_s\": " << o.median
        << ", \"runtime_p90_s\": " << o.p90 << ", \"hand_median_s\": " << h.median
        << ", \"hand_p90_s\": " << h.p90 << ", \"ratio\": " << o.median / h.median
        << ", \"added_us\": " << (o.median - h.median) * 1e6 << "}\n}\n";
    std::printf("wrote %s\n", args.json.c_str());
  }
  cudaStreamDestroy(stream);
  return 0;
}

// One grid per launch: every segment is cut into 16 KiB chunks, one thread block per chunk, and a
// block finds its segment by binary search over the segments' first blocks. The segment table
// travels as a kernel parameter (__grid_constant__, so no staging buffer in host or device memory
// has to outlive the launch): launches of many batches can be queued without any host wait.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "ops/cuda/batched_copy.h"

namespace hvdc {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kBlockBytes = 16 * 1024;  // multiple of every element size and of 16

struct DeviceSegment {
  const uint8_t* src;
  uint8_t* dst;
  int64_t bytes;
  int64_t first_block;
  int32_t width;  // unscaled: bytes per load/store (16, 8, 4, 2 or 1), from the alignment
};

template <int kCap>
struct SegmentTable {
  DeviceSegment seg[kCap];
  int count;
};

// The segment holding block `b` (segments are sorted by first_block, none empty).
template <int kCap>
__device__ const DeviceSegment& FindSegment(const SegmentTable<kCap>& t, int64_t b) {
  int lo = 0;
  int hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.seg[mid].first_block <= b) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return t.seg[lo];
}

// d[i] = f(s[i]) for i < n over the block's threads, kUnroll loads in flight per thread before
// their stores (memory-level parallelism; in place is safe: a thread stores only what it loaded).
template <typename V, typename F>
__device__ void MapChunk(const V* s, V* d, int64_t n, F f) {
  constexpr int kUnroll = 4;
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < n; i += kUnroll * kThreads) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = s[i + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[i + u * kThreads] = f(v[u]);
  }
  for (; i < n; i += kThreads) d[i] = f(s[i]);
}

template <typename V>
__device__ void CopyChunk(const uint8_t* src, uint8_t* dst, int64_t bytes) {
  const int64_t n = bytes / static_cast<int64_t>(sizeof(V));
  MapChunk(reinterpret_cast<const V*>(src), reinterpret_cast<V*>(dst), n, [](V v) { return v; });
  const int64_t tail = n * static_cast<int64_t>(sizeof(V));
  if (threadIdx.x < bytes - tail) dst[tail + threadIdx.x] = src[tail + threadIdx.x];
}

template <int kCap>
__global__ void __launch_bounds__(kThreads)
    CopyKernel(const __grid_constant__ SegmentTable<kCap> t) {
  const int64_t b = blockIdx.x;
  const DeviceSegment& s = FindSegment(t, b);
  const int64_t start = (b - s.first_block) * kBlockBytes;
  const int64_t bytes = s.bytes - start < kBlockBytes ? s.bytes - start : kBlockBytes;
  const uint8_t* src = s.src + start;
  uint8_t* dst = s.dst + start;
  switch (s.width) {
    case 16:
      return CopyChunk<uint4>(src, dst, bytes);
    case 8:
      return CopyChunk<uint2>(src, dst, bytes);
    case 4:
      return CopyChunk<uint32_t>(src, dst, bytes);
    case 2:
      return CopyChunk<uint16_t>(src, dst, bytes);
    default:
      return CopyChunk<uint8_t>(src, dst, bytes);
  }
}

// Integer limits usable in device code (std::numeric_limits' functions are host-only).
template <typename T>
struct IntRange {
  static constexpr bool kSigned = T(-1) < T(0);
  static constexpr int kDigits = static_cast<int>(sizeof(T) * 8) - (kSigned ? 1 : 0);
  static constexpr T kMax = kSigned ? T((uint64_t{1} << kDigits) - 1) : T(~T(0));
  static constexpr T kMin = kSigned ? T(-kMax - 1) : T(0);
};

// Scaling, element by element, with the host kernels' rounding (ops/cpu/kernels.cc).
template <typename T>
__device__ T ScaleOne(T x, double scale) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(__half2float(x) * static_cast<float>(scale));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(__bfloat162float(x) * static_cast<float>(scale));
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(static_cast<double>(x) * scale);
  } else {
    const double t = trunc(static_cast<double>(x) * scale);
    if (!(t == t)) return T(0);
    if constexpr (sizeof(T) <= 4) {
      constexpr double kLo = static_cast<double>(IntRange<T>::kMin);
      constexpr double kHi = static_cast<double>(IntRange<T>::kMax);
      return static_cast<T>(t < kLo ? kLo : (t > kHi ? kHi : t));
    } else {
      const double hi = ldexp(1.0, IntRange<T>::kDigits);  // just above the range
      const double lo = IntRange<T>::kSigned ? -hi : 0.0;
      if (t >= hi) return IntRange<T>::kMax;
      if (t < lo) return IntRange<T>::kMin;
      return static_cast<T>(t);
    }
  }
}

template <typename T, int kCap>
__global__ void __launch_bounds__(kThreads)
    ScaleKernel(const __grid_constant__ SegmentTable<kCap> t, double scale) {
  const int64_t b = blockIdx.x;
  const DeviceSegment& s = FindSegment(t, b);
  const int64_t start = (b - s.first_block) * kBlockBytes;
  const int64_t bytes = s.bytes - start < kBlockBytes ? s.bytes - start : kBlockBytes;
  const T* src = reinterpret_cast<const T*>(s.src + start);
  T* dst = reinterpret_cast<T*>(s.dst + start);
  const int64_t n = bytes / static_cast<int64_t>(sizeof(T));
  MapChunk(src, dst, n, [scale](T x) { return ScaleOne(x, scale); });
}

// Element sizes without core's DataTypeSize, so that this library stands alone (bench/gpu_bench).
int64_t ElementSize(DataType t) {
  switch (t) {
    case DataType::kUint8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kUint16:
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  return 1;
}

int VectorWidth(const void* src, const void* dst) {
  const auto bits = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst);
  for (int w = 16; w > 1; w /= 2) {
    if (bits % static_cast<uintptr_t>(w) == 0) return w;
  }
  return 1;
}

template <int kCap>
cudaError_t LaunchTable(const CopySegment* segments, int count, DataType dtype, double scale,
                        cudaStream_t stream) {
  SegmentTable<kCap> t;
  t.count = 0;
  int64_t blocks = 0;
  const bool scaled = scale != 1.0 && dtype != DataType::kBool;
  for (int i = 0; i < count; ++i) {
    const CopySegment& c = segments[i];
    if (c.bytes <= 0 || (!scaled && c.src == c.dst)) continue;
    DeviceSegment& d = t.seg[t.count++];
    d.src = static_cast<const uint8_t*>(c.src);
    d.dst = static_cast<uint8_t*>(c.dst);
    d.bytes = c.bytes;
    d.first_block = blocks;
    d.width = VectorWidth(c.src, c.dst);
    blocks += (c.bytes + kBlockBytes - 1) / kBlockBytes;
  }
  if (blocks == 0) return cudaSuccess;
  if (blocks > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks));
  if (!scaled) {
    CopyKernel<kCap><<<grid, kThreads, 0, stream>>>(t);
    return cudaGetLastError();
  }
  switch (dtype) {
    case DataType::kUint8:
      ScaleKernel<uint8_t, kCap><<<grid, kThreads, 0, stream>>>(t, scale);
      break;
    case DataType::kInt8:
      ScaleKernel<int8_t, kCap><<<grid, kThreads, 0, stream>>>(t, scale);
      break;
    case DataType::kUint16:
      ScaleKernel<uint16_t, kCap><<<grid, kThreads, 0, stream>>>(t, scale);
      break;
    case DataType::kInt16:
      ScaleKernel<int16_t, kCap><<<grid, kThreads, 0, stream>>>(t, scale);
      break;
    case DataType::kInt32:
      ScaleKernel<int32_t, kCap><<<grid, kThreads, 0, stream>>>(t, scale);
      break;
    case DataType::kInt64:
      ScaleKernel<int64_t, kCap><<<grid, kThreads, 0, stream>>>(t, scale);
      break;
    case DataType::kFloat16:
      ScaleKernel<__half, kCap><<<grid, kThreads, 0, stream>>>(t, scale);
      break;
    case DataType::kBfloat16:
      ScaleKernel<__nv_bfloat16, kCap><<<grid, kThreads, 0, stream>>>(t, scale);
      break;
    case DataType::kFloat32:
      ScaleKernel<float, kCap><<<grid, kThreads, 0, stream>>>(t, scale);
      break;
    case DataType::kFloat64:
      ScaleKernel<double, kCap><<<grid, kThreads, 0, stream>>>(t, scale);
      break;
    case DataType::kBool:
      break;  // unreachable: bool is never scaled
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t BatchedCopy(const CopySegment* segments, int count, DataType dtype, double scale,
                        cudaStream_t stream) {
  // Small tables for small batches: the parameter block is copied with every launch.
  for (int done = 0; done < count;) {
    const int n = count - done < kMaxSegmentsPerLaunch ? count - done : kMaxSegmentsPerLaunch;
    const cudaError_t e =
        n <= 16    ? LaunchTable<16>(segments + done, n, dtype, scale, stream)
        : n <= 128 ? LaunchTable<128>(segments + done, n, dtype, scale, stream)
                   : LaunchTable<kMaxSegmentsPerLaunch>(segments + done, n, dtype, scale, stream);
    if (e != cudaSuccess) return e;
    done += n;
  }
  return cudaSuccess;
}

cudaError_t Scale(void* dst, const void* src, int64_t count, DataType dtype, double scale,
                  cudaStream_t stream) {
  CopySegment s;
  s.src = src;
  s.dst = dst;
  s.bytes = count * ElementSize(dtype);
  return BatchedCopy(&s, 1, dtype, scale, stream);
}

}  // namespace cuda
}  // namespace hvdc

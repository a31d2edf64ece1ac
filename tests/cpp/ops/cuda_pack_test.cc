// The batched pack/unpack kernel (ops/cuda/batched_copy.cu) against the host reference
// (cpu::ScaleCopy): every dtype, odd element counts and offsets, unaligned byte copies, several
// scale factors, more segments than one launch takes. Bit-exact: both sides round the same way.
// Skips (visibly) when no CUDA device is present; CI builds and links it anyway.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/types.h"
#include "ops/cpu/kernels.h"
#include "ops/cuda/batched_copy.h"
#include "tests/cpp/util/cuda_test_util.h"

namespace hvdc {
namespace {

template <typename T>
cudaError_t DeviceAlloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes == 0 ? 1 : bytes);
}

const DataType kAllTypes[] = {DataType::kUint8,   DataType::kInt8,    DataType::kUint16,
                              DataType::kInt16,   DataType::kInt32,   DataType::kInt64,
                              DataType::kFloat16, DataType::kFloat32, DataType::kFloat64,
                              DataType::kBool,    DataType::kBfloat16};

// Finite values that exercise rounding and (for integers) saturation when scaled.
std::vector<uint8_t> RandomElements(DataType t, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> real(-1000.0, 1000.0);
  std::vector<uint8_t> out(static_cast<size_t>(n) * DataTypeSize(t));
  for (int64_t i = 0; i < n; ++i) {
    const double v = real(rng);
    uint8_t* p = out.data() + i * DataTypeSize(t);
    switch (t) {
      case DataType::kFloat32: {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DataType::kFloat64:
        std::memcpy(p, &v, 8);
        break;
      case DataType::kFloat16:
      case DataType::kBfloat16: {
        // bf16: the top half of a float32; fp16: a random finite half of either sign.
        const float f = static_cast<float>(v);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const uint16_t sign = static_cast<uint16_t>((rng() & 1) << 15);
        const uint16_t h = t == DataType::kBfloat16
                               ? static_cast<uint16_t>(bits >> 16)
                               : static_cast<uint16_t>(sign | (rng() % 0x7800));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kBool:
        p[0] = static_cast<uint8_t>(rng() & 1);
        break;
      default: {
        const uint64_t r = (static_cast<uint64_t>(rng()) << 32) | rng();
        std::memcpy(p, &r, DataTypeSize(t));
        break;
      }
    }
  }
  return out;
}

struct Case {
  DataType dtype;
  double scale;
  std::vector<int64_t> counts;   // elements per segment
  std::vector<int64_t> offsets;  // element offset of each segment in the scattered memory
};

// Copies scattered segments into a packed buffer (pack) and back out (unpack), each with its own
// scale, and compares both with cpu::ScaleCopy.
void RunCase(const Case& c, uint32_t seed) {
  const int64_t es = static_cast<int64_t>(DataTypeSize(c.dtype));
  const size_t n = c.counts.size();
  std::vector<int64_t> scattered_at(n), packed_at(n);
  int64_t scattered = 0, packed = 0;
  for (size_t i = 0; i < n; ++i) {
    scattered_at[i] = (scattered + c.offsets[i]) * es;
    scattered += c.offsets[i] + c.counts[i];
    packed_at[i] = packed * es;
    packed += c.counts[i] + 1;  // a gap element between slots
  }
  const int64_t total_elems = std::max<int64_t>(scattered, 1);
  std::vector<uint8_t> host_in = RandomElements(c.dtype, total_elems, seed);
  uint8_t* d_in = nullptr;
  uint8_t* d_packed = nullptr;
  uint8_t* d_out = nullptr;
  const size_t in_bytes = host_in.size();
  const size_t packed_bytes = static_cast<size_t>(std::max<int64_t>(packed, 1) * es);
  ASSERT_CUDA(DeviceAlloc(&d_in, in_bytes));
  ASSERT_CUDA(DeviceAlloc(&d_packed, packed_bytes));
  ASSERT_CUDA(DeviceAlloc(&d_out, in_bytes));
  ASSERT_CUDA(cudaMemcpy(d_in, host_in.data(), in_bytes, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(d_packed, 0xab, packed_bytes));
  ASSERT_CUDA(cudaMemset(d_out, 0xcd, in_bytes));

  std::vector<cuda::CopySegment> pack(n), unpack(n);
  for (size_t i = 0; i < n; ++i) {
    pack[i] = {d_in + scattered_at[i], d_packed + packed_at[i], c.counts[i] * es};
    unpack[i] = {d_packed + packed_at[i], d_out + scattered_at[i], c.counts[i] * es};
  }
  ASSERT_CUDA(cuda::BatchedCopy(pack.data(), static_cast<int>(n), c.dtype, c.scale, nullptr));
  ASSERT_CUDA(cuda::BatchedCopy(unpack.data(), static_cast<int>(n), c.dtype, c.scale, nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());

  std::vector<uint8_t> got_packed(packed_bytes), got_out(in_bytes);
  ASSERT_CUDA(cudaMemcpy(got_packed.data(), d_packed, packed_bytes, cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(got_out.data(), d_out, in_bytes, cudaMemcpyDeviceToHost));
  cudaFree(d_in);
  cudaFree(d_packed);
  cudaFree(d_out);

  std::vector<uint8_t> want_packed(packed_bytes, 0xab), want_out(in_bytes, 0xcd);
  for (size_t i = 0; i < n; ++i) {
    cpu::ScaleCopy(want_packed.data() + packed_at[i], host_in.data() + scattered_at[i], c.counts[i],
                   c.dtype, c.scale);
    cpu::ScaleCopy(want_out.data() + scattered_at[i], want_packed.data() + packed_at[i],
                   c.counts[i], c.dtype, c.scale);
  }
  for (size_t i = 0; i < packed_bytes; ++i) {
    ASSERT_EQ(got_packed[i], want_packed[i])
        << DataTypeName(c.dtype) << " scale " << c.scale << ": packed byte " << i;
  }
  for (size_t i = 0; i < in_bytes; ++i) {
    ASSERT_EQ(got_out[i], want_out[i])
        << DataTypeName(c.dtype) << " scale " << c.scale << ": unpacked byte " << i;
  }
}

TEST(CudaPack, EveryDtypeOddSizesAndOffsets) {
  SKIP_WITHOUT_GPU();
  const std::vector<int64_t> counts = {1, 3, 0, 17, 1023, 4097, 16 * 1024 + 5, 100003, 2};
  const std::vector<int64_t> offsets = {0, 1, 3, 0, 5, 7, 1, 2, 9};
  uint32_t seed = 1;
  for (DataType t : kAllTypes) {
    for (double scale : {1.0, 0.5, 2.5, -3.0, 1.0 / 3}) {
      SCOPED_TRACE(std::string(DataTypeName(t)) + " scale " + std::to_string(scale));
      RunCase({t, scale, counts, offsets}, seed++);
      if (HasFatalFailure()) return;
    }
  }
}

// Unscaled copies at any byte alignment (the kernel picks the widest vector both ends allow).
TEST(CudaPack, UnalignedBytes) {
  SKIP_WITHOUT_GPU();
  for (int64_t off = 0; off < 17; ++off) {
    RunCase({DataType::kUint8, 1.0, {off + 1, 4096 + off, 70000 + off}, {off, 1, off / 2}},
            static_cast<uint32_t>(100 + off));
    if (HasFatalFailure()) return;
  }
}

// More segments than one launch takes, and sizes around the tiers (16, 128, 512 per launch).
TEST(CudaPack, ManySegments) {
  SKIP_WITHOUT_GPU();
  for (int segs : {15, 16, 17, 128, 129, 511, 512, 513, 1500}) {
    std::vector<int64_t> counts(static_cast<size_t>(segs)), offsets(static_cast<size_t>(segs));
    for (int i = 0; i < segs; ++i) {
      counts[static_cast<size_t>(i)] = (i * 37) % 301;
      offsets[static_cast<size_t>(i)] = i % 3;
    }
    SCOPED_TRACE(segs);
    RunCase({DataType::kFloat32, 1.0, counts, offsets}, 7);
    RunCase({DataType::kFloat16, 0.25, counts, offsets}, 8);
    if (HasFatalFailure()) return;
  }
}

// The scale kernel, in place and out of place.
TEST(CudaPack, ScaleInPlace) {
  SKIP_WITHOUT_GPU();
  for (DataType t : kAllTypes) {
    const int64_t n = 12345;
    std::vector<uint8_t> host = RandomElements(t, n, 42);
    uint8_t* d = nullptr;
    ASSERT_CUDA(DeviceAlloc(&d, host.size()));
    ASSERT_CUDA(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice));
    ASSERT_CUDA(cuda::Scale(d, d, n, t, 0.125, nullptr));
    std::vector<uint8_t> got(host.size());
    ASSERT_CUDA(cudaMemcpy(got.data(), d, host.size(), cudaMemcpyDeviceToHost));
    cudaFree(d);
    cpu::ScaleCopy(host.data(), host.data(), n, t, 0.125);
    EXPECT_EQ(got, host) << DataTypeName(t);
  }
}

}  // namespace
}  // namespace hvdc

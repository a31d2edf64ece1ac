// Batched device copies for the GPU fusion buffer: one kernel launch copies many (src, dst, bytes)
// segments -- tensors into the buffer (pack) or out of it (unpack) -- optionally multiplying every
// element by a scale factor on the way, so pre/postscale never costs a separate pass.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/types.h"

namespace hvdc {
namespace cuda {

struct CopySegment {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t bytes = 0;
};

// Segments one launch takes; more are copied by further launches on the same stream.
constexpr int kMaxSegmentsPerLaunch = 512;

// Copies every segment on `stream` (asynchronously). Segments must not overlap each other; a
// segment may be in place (src == dst) only when it is scaled. With scale != 1 every element of
// `dtype` is multiplied as cpu::ScaleCopy does (fp16/bf16 in float, fp32/fp64 in double, integers
// in double then truncated and saturated, bool copied unchanged); src, dst and bytes must then be
// multiples of the element size. Unscaled copies take any alignment (16-byte vectors when
// aligned). Returns the launch error, if any.
cudaError_t BatchedCopy(const CopySegment* segments, int count, DataType dtype, double scale,
                        cudaStream_t stream);

// dst[i] = src[i] * scale for `count` elements (dst == src: in place).
cudaError_t Scale(void* dst, const void* src, int64_t count, DataType dtype, double scale,
                  cudaStream_t stream);

}  // namespace cuda
}  // namespace hvdc

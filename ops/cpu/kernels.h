// Elementwise CPU kernels used by every host-memory backend: reductions (the MPI user ops for
// float16/bfloat16 and the in-memory data plane use them) and scaling (prescale/postscale are
// applied while packing and unpacking, never as a separate pass).
#pragma once

#include <cstdint>

#include "core/types.h"

namespace hvdc {
namespace cpu {

// dst[i] = dst[i] op src[i] for i < count. op is Sum, Min, Max or Product (Average is treated as
// Sum: the caller folds 1/size into a postscale). bool: Sum/Max = or, Min/Product = and.
void ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op);

// dst[i] = src[i] * factor. dst may equal src (in place); factor == 1 is a plain copy. Integers
// are scaled in double and truncated toward zero; bool is copied unscaled.
void ScaleCopy(void* dst, const void* src, int64_t count, DataType dtype, double factor);

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);  // round to nearest even
float Bfloat16ToFloat(uint16_t b);
uint16_t FloatToBfloat16(float f);  // round to nearest even

}  // namespace cpu
}  // namespace hvdc

// The vector instruction sets the CPU kernels are compiled for, and which one runs (internal to
// ops/cpu and its tests; the entry points are in kernels.h). The same loops are compiled once per
// level; every level gives bitwise the same results (docs/cpu_kernels.md says what that covers), so
// ranks on different CPUs of one job still agree.
#pragma once

#include <cstdint>

#include "core/types.h"

#if defined(__x86_64__) || defined(__i386__)
#define HVDC_HAVE_X86 1
// AVX2 (with F16C: every AVX2 CPU has it) and AVX-512 (Foundation, Byte/Word, Doubleword/Quadword
// and Vector Length: Skylake-SP and later, Zen 4 and later). On a function, these compile it for
// that level; it may only run when SupportedSimdLevel() reaches the level.
#define HVDC_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#define HVDC_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c")))
#endif

namespace hvdc {
namespace cpu {

// Ordered: each level runs on a CPU that has the one above it.
enum class SimdLevel : int {
  kBaseline = 0,  // what the build targets (SSE2 on x86-64); also every level off x86
  kAvx2 = 1,      // 256-bit, and F16C for float16
  kAvx512 = 2,    // 512-bit
};
constexpr SimdLevel kAllSimdLevels[] = {SimdLevel::kBaseline, SimdLevel::kAvx2, SimdLevel::kAvx512};

const char* SimdLevelName(SimdLevel level);  // "baseline", "avx2", "avx512"

// The widest level this CPU and OS run (cpuid, and XCR0 for the OS saving the wide registers),
// detected once.
SimdLevel SupportedSimdLevel();

// The level ReduceInto and ScaleCopy use: SupportedSimdLevel() unless capped lower.
SimdLevel ActiveSimdLevel();

// Caps the active level at `max` (never above SupportedSimdLevel()) and returns the level now
// active. Meant for start-up and tests; calls running at the same time finish at either level.
SimdLevel CapSimdLevel(SimdLevel max);

// ReduceInto and ScaleCopy at a given level (clamped to SupportedSimdLevel()), for tests.
void ReduceIntoAt(SimdLevel level, void* dst, const void* src, int64_t count, DataType dtype,
                  ReduceOp op);
void ScaleCopyAt(SimdLevel level, void* dst, const void* src, int64_t count, DataType dtype,
                 double factor);

// F16C alone (the array conversions in half.cc use it apart from the levels).
bool HaveF16C();

}  // namespace cpu
}  // namespace hvdc

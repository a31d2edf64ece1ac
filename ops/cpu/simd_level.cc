// CPU feature detection and the active kernel level.
#include "ops/cpu/simd_level.h"

#include <algorithm>
#include <atomic>

#ifdef HVDC_HAVE_X86
#include <cpuid.h>
#endif

namespace hvdc {
namespace cpu {
namespace {

struct CpuFeatures {
  bool f16c = false;
  SimdLevel level = SimdLevel::kBaseline;
};

#ifdef HVDC_HAVE_X86

// From cpuid, not __builtin_cpu_supports: clang's does not know "f16c", and neither checks that the
// OS saves the wide registers (XCR0: bits 1-2 for YMM, 5-7 for the AVX-512 state).
CpuFeatures DetectCpu() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
  if (!osxsave || !avx) return f;
  unsigned xcr0 = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0 & 0x6) != 0x6) return f;
  f.f16c = f16c;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = (b >> 5) & 1;
  if (!avx2 || !f16c) return f;
  f.level = SimdLevel::kAvx2;
  const bool avx512 = ((b >> 16) & 1) /*F*/ && ((b >> 17) & 1) /*DQ*/ && ((b >> 30) & 1) /*BW*/ &&
                      ((b >> 31) & 1) /*VL*/;
  if (avx512 && (xcr0 & 0xe6) == 0xe6) f.level = SimdLevel::kAvx512;
  return f;
}

#else

CpuFeatures DetectCpu() { return {}; }

#endif

const CpuFeatures& Cpu() {
  static const CpuFeatures features = DetectCpu();
  return features;
}

// Read on every kernel call, so relaxed: a cap set at start-up is seen by the threads started
// after.
std::atomic<int>& Active() {
  static std::atomic<int> level{static_cast<int>(Cpu().level)};
  return level;
}

}  // namespace

const char* SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kBaseline:
      return "baseline";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "?";
}

SimdLevel SupportedSimdLevel() { return Cpu().level; }

SimdLevel ActiveSimdLevel() {
  return static_cast<SimdLevel>(Active().load(std::memory_order_relaxed));
}

SimdLevel CapSimdLevel(SimdLevel max) {
  const SimdLevel level = std::min(max, SupportedSimdLevel());
  Active().store(static_cast<int>(level), std::memory_order_relaxed);
  return level;
}

bool HaveF16C() { return Cpu().f16c; }

}  // namespace cpu
}  // namespace hvdc

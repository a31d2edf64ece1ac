// Elementwise loop skeletons the CPU kernels share (internal to ops/cpu). Loops run in fixed blocks
// of kBlock elements: GCC's -O2 vectoriser (the "very cheap" cost model) only vectorises a loop
// whose trip count is a multiple of the vector width and that needs no runtime alias check. So
// blocks are constant-size and their pointers __restrict; an exact alias (dst == src) takes a
// single-pointer path, and partial overlap is not allowed.
#pragma once

#include <cstdint>

namespace hvdc {
namespace cpu {
namespace loops {

constexpr int64_t kBlock = 64;

// GCC honours __restrict on function parameters (not on block-scoped pointers), so each block is
// a function of its own; it is inlined.
template <typename T, typename F>
inline void ZipBlock(T* __restrict d, const T* __restrict s, F f) {
  for (int64_t j = 0; j < kBlock; ++j) d[j] = f(d[j], s[j]);
}

template <typename T, typename F>
inline void MapBlock(T* __restrict d, const T* __restrict s, F f) {
  for (int64_t j = 0; j < kBlock; ++j) d[j] = f(s[j]);
}

template <typename T, typename F>
inline void MapBlockInPlace(T* __restrict d, F f) {
  for (int64_t j = 0; j < kBlock; ++j) d[j] = f(d[j]);
}

// dst[i] = f(dst[i], src[i]); dst and src are the same or do not overlap.
template <typename T, typename F>
inline void Zip(T* dst, const T* src, int64_t n, F f) {
  int64_t i = 0;
  if (dst == src) {
    for (; i + kBlock <= n; i += kBlock) MapBlockInPlace(dst + i, [f](T x) { return f(x, x); });
  } else {
    for (; i + kBlock <= n; i += kBlock) ZipBlock(dst + i, src + i, f);
  }
  for (; i < n; ++i) dst[i] = f(dst[i], src[i]);
}

// dst[i] = f(src[i]); dst and src are the same or do not overlap.
template <typename T, typename F>
inline void Map(T* dst, const T* src, int64_t n, F f) {
  int64_t i = 0;
  if (dst == src) {
    for (; i + kBlock <= n; i += kBlock) MapBlockInPlace(dst + i, f);
  } else {
    for (; i + kBlock <= n; i += kBlock) MapBlock(dst + i, src + i, f);
  }
  for (; i < n; ++i) dst[i] = f(src[i]);
}

}  // namespace loops
}  // namespace cpu
}  // namespace hvdc

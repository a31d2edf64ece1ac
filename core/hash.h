// A hash of small integer lists, equal on every rank for equal input (FNV-1a over the values, then
// the count): what ranks compare to agree on a configuration or a process set.
#pragma once

#include <cstdint>
#include <vector>

namespace hvdc {

inline uint64_t HashInts(const std::vector<int>& values) {
  uint64_t h = 1469598103934665603ULL;
  for (int v : values) h = (h ^ static_cast<uint64_t>(v + 1)) * 1099511628211ULL;
  return h ^ values.size();
}

}  // namespace hvdc

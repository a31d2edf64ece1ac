// Durations from seconds as the configuration gives them.
#pragma once

#include <chrono>

namespace hvdc {

inline std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

}  // namespace hvdc

// Monotonic nanoseconds, for the busy-time counters in stats.
#pragma once

#include <chrono>
#include <cstdint>

namespace chute {

inline uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace chute

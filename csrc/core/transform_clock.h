// Time a thread spends in image transforms (resampling, crop, flip, the
// output's layout and dtype writes). They run fused with the codec, on the
// rows it hands over, so no stage boundary can be timed from outside: the
// transform code times itself into a counter of its own thread, and the
// piece scheduler reads that counter around each piece it runs (one shared
// atomic add per piece, none per row).
#pragma once

#include <cstdint>

#include "core/clock.h"

namespace chute {

// This thread's transform nanoseconds so far.
inline uint64_t& thread_transform_ns() {
  thread_local uint64_t ns = 0;
  return ns;
}

// Adds the time from its construction to its destruction to this thread's
// transform time (also when the scope ends by an exception).
class TransformTimer {
 public:
  TransformTimer() : start_(now_ns()) {}
  ~TransformTimer() { thread_transform_ns() += now_ns() - start_; }
  TransformTimer(const TransformTimer&) = delete;
  TransformTimer& operator=(const TransformTimer&) = delete;

 private:
  const uint64_t start_;
};

}  // namespace chute

// The errors met under the skip policy and the samples they cost: the
// samples all counted, the latest errors kept (kind, message and where
// raised, and which sample where one was) until the consumer takes them for
// Python's handler.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "core/error.h"

namespace chute {

// One skip: its error and, as data rather than words of the message, the
// sample it dropped where the error was one sample's (-1: not known).
struct SkippedSample {
  Error error;
  int64_t index = -1;   // the id it was asked for by (the indexed engine's ids)
  int64_t source = -1;  // which of the plan's sources (shard, row group) holds it
  int64_t offset = -1;  // where it starts in that source (a byte, a row of a row group)
};

class SkipLog {
 public:
  // `samples_lost`: how many samples the error kept from the consumer; 0
  // for a fault reported with the sample it flawed, which was delivered.
  void record(const Error& error, uint64_t samples_lost = 1) {
    record(SkippedSample{error}, samples_lost);
  }
  void record(SkippedSample skipped, uint64_t samples_lost = 1) {
    count_.fetch_add(samples_lost, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mutex_);
    if (kept_.size() >= kMaxKept) kept_.pop_front();
    kept_.push_back(std::move(skipped));
  }

  // The skips recorded since the last call, oldest first.
  std::vector<SkippedSample> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<SkippedSample> out(kept_.begin(), kept_.end());
    kept_.clear();
    return out;
  }

  // Samples lost.
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  // A consumer that never looks (ignore_and_continue) must not grow memory.
  static constexpr size_t kMaxKept = 1000;
  std::mutex mutex_;
  std::deque<SkippedSample> kept_;
  std::atomic<uint64_t> count_{0};
};

}  // namespace chute

// Per-stream shuffle buffer of encoded samples, bounded in samples and bytes.
// It fills to `initial` before the first sample leaves, then grows towards
// `capacity` by taking two samples in for each one out (as webdataset does,
// so early output is not starved of randomness), and swaps a uniformly random
// element out for every element in. At the end of the stream it drains in
// random order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/random.h"

namespace chute {

// The seed of stream `stream`'s shuffle buffer in an epoch of a plan seeded
// `plan_seed`: the engine and the replay (schedule/shuffle_replay.h) share it.
inline uint64_t stream_shuffle_seed(uint64_t plan_seed, int64_t epoch, uint64_t stream) {
  return derive_seed({plan_seed, static_cast<uint64_t>(epoch), stream, 0x5355464655ULL});
}

template <typename T>
class ShuffleBuffer {
 public:
  // capacity == 0 disables shuffling (samples pass straight through).
  ShuffleBuffer(size_t capacity, size_t initial, size_t max_bytes, uint64_t seed)
      : capacity_(capacity),
        initial_(initial < capacity ? initial : capacity),
        max_bytes_(max_bytes),
        rng_(seed) {}

  bool enabled() const { return capacity_ > 0; }

  // Adds a sample; if the buffer is warm, moves one random sample to `out`
  // and returns true.
  bool push(T item, size_t bytes, T* out) {
    items_.push_back({std::move(item), bytes});
    bytes_ += bytes;
    if (bytes_ > peak_bytes_) peak_bytes_ = bytes_;
    if (items_.size() > peak_items_) peak_items_ = items_.size();
    if (items_.size() < initial_) return false;
    // Grow by one extra sample per output until full, unless bytes are over budget.
    if (items_.size() < capacity_ && bytes_ <= max_bytes_ && grow_toggle_) {
      grow_toggle_ = false;
      return false;
    }
    grow_toggle_ = true;
    return pop(out);
  }

  // Moves a random remaining sample to `out`; false when empty.
  bool pop(T* out) {
    if (items_.empty()) return false;
    const size_t j = rng_.below(items_.size());
    std::swap(items_[j], items_.back());
    *out = std::move(items_.back().item);
    bytes_ -= items_.back().bytes;
    items_.pop_back();
    return true;
  }

  // True while the buffered bytes exceed the byte budget: the caller pops
  // until it is not, so a few huge samples cannot blow the memory bound.
  bool over_budget() const { return bytes_ > max_bytes_ && !items_.empty(); }

  // One sample of the stream through the buffer, as the stream thread moves
  // it: pushed, then samples leave while the buffer is over its byte budget.
  // `emit` takes each sample that leaves and returns false to stop (the
  // result is then false).
  template <typename Emit>
  bool feed(T item, size_t bytes, Emit&& emit) {
    T out;
    if (push(std::move(item), bytes, &out) && !emit(std::move(out))) return false;
    while (over_budget() && pop(&out)) {
      if (!emit(std::move(out))) return false;
    }
    return true;
  }

  size_t size() const { return items_.size(); }
  size_t bytes() const { return bytes_; }
  size_t peak_bytes() const { return peak_bytes_; }
  size_t peak_items() const { return peak_items_; }

 private:
  struct Entry {
    T item;
    size_t bytes;
  };
  size_t capacity_;
  size_t initial_;
  size_t max_bytes_;
  Rng rng_;
  std::vector<Entry> items_;
  size_t bytes_ = 0;
  size_t peak_bytes_ = 0;
  size_t peak_items_ = 0;
  bool grow_toggle_ = true;
};

}  // namespace chute

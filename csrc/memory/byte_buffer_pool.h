// Payload buffers handed back by the decode threads once a batch is done and
// reused by the parse threads for the next samples. Without it every sample's
// bytes landed in freshly mapped pages: glibc returns freed heap tops to the
// kernel, and touching them again cost a page fault per 4 KiB, a large share
// of an epoch's page faults (benchmarks/README.md, "Measurements behind code
// choices").
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace chute {

class ByteBufferPool {
 public:
  // Holds at most `max_bytes` of capacity, in buffers of at most
  // `max_buffer_bytes` each (a rare huge sample is not kept).
  ByteBufferPool(size_t max_bytes, size_t max_buffer_bytes)
      : max_bytes_(max_bytes), max_buffer_bytes_(max_buffer_bytes) {}

  // An empty buffer, with capacity when one was returned.
  std::vector<uint8_t> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (buffers_.empty()) return {};
    std::vector<uint8_t> out = std::move(buffers_.back());
    buffers_.pop_back();
    held_bytes_ -= out.capacity();
    return out;
  }

  void give(std::vector<uint8_t>&& buffer) {
    const size_t capacity = buffer.capacity();
    if (capacity == 0 || capacity > max_buffer_bytes_) return;
    buffer.clear();
    std::lock_guard<std::mutex> lock(mutex_);
    if (held_bytes_ + capacity > max_bytes_) return;
    held_bytes_ += capacity;
    buffers_.push_back(std::move(buffer));
  }

 private:
  std::mutex mutex_;
  std::vector<std::vector<uint8_t>> buffers_;
  size_t held_bytes_ = 0;
  const size_t max_bytes_;
  const size_t max_buffer_bytes_;
};

}  // namespace chute

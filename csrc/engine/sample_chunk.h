// Samples travel from parse threads to stream threads to the assembler in
// chunks of at most kChunkBytes (or of a chunk's sample count, or of one
// sample larger than this): enough to make a hand-off cheap, little enough
// that the queues between the threads hold a few MiB, not a few chunks of
// large samples.
#pragma once

#include <cstddef>
#include <exception>
#include <utility>
#include <vector>

#include "batching/sample_fields.h"
#include "engine/bounded_queue.h"

namespace chute {

constexpr size_t kChunkBytes = size_t{4} << 20;

struct SampleChunk {
  std::vector<PlannedSample> samples;
  // After the samples, the error the sender failed with (raised in the
  // receiver's thread), or the end of what the sender sends.
  std::exception_ptr error;
  bool end = false;

  static SampleChunk ending() {
    SampleChunk c;
    c.end = true;
    return c;
  }
  static SampleChunk failure(std::exception_ptr error) {
    SampleChunk c;
    c.error = std::move(error);
    return c;
  }
};

// Gathers samples into a chunk until it holds `max_samples` samples or
// `max_bytes` bytes (EncodedSample::held_bytes).
class ChunkFiller {
 public:
  explicit ChunkFiller(size_t max_samples, size_t max_bytes = kChunkBytes)
      : max_samples_(max_samples), max_bytes_(max_bytes) {
    chunk_.samples.reserve(max_samples_);
  }

  // True once the chunk is full and should be sent.
  bool add(PlannedSample&& sample) {
    bytes_ += sample.encoded.held_bytes();
    chunk_.samples.push_back(std::move(sample));
    return chunk_.samples.size() >= max_samples_ || bytes_ >= max_bytes_;
  }

  bool empty() const { return chunk_.samples.empty(); }

  // The chunk gathered so far; the next one starts empty.
  SampleChunk take() {
    SampleChunk out;
    out.samples.swap(chunk_.samples);
    chunk_.samples.reserve(max_samples_);
    bytes_ = 0;
    return out;
  }

  // Sends the chunk gathered so far, if it holds any sample. False once
  // `queue` is closed (the receiver stopped).
  bool flush_to(BoundedQueue<SampleChunk>& queue) { return empty() || queue.push(take()); }

 private:
  const size_t max_samples_;
  const size_t max_bytes_;
  SampleChunk chunk_;
  size_t bytes_ = 0;
};

}  // namespace chute

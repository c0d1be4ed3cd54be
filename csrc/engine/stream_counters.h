// What the stream engine's threads count while an epoch runs, for
// StreamEngine::stats() (the keys are explained in engine/engine_stats.h).
// Any thread may count and read at any time: each counter is exact on its
// own, the set of them is not one snapshot.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "engine/engine_stats.h"
#include "sources/encoded_sample.h"

namespace chute {

class StreamCounters {
 public:
  // A parse thread.
  void shard_opened() { shards_opened_.fetch_add(1); }
  void sample_read(const EncodedSample& sample) {
    samples_read_.fetch_add(1, std::memory_order_relaxed);
    encoded_bytes_.fetch_add(sample.payload_bytes, std::memory_order_relaxed);
  }
  void read_time(uint64_t ns) { read_ns_.fetch_add(ns, std::memory_order_relaxed); }

  // What one stream's shuffle buffer held at its last report (each stream
  // thread keeps its own; zero before the first).
  struct ShuffleLevel {
    uint64_t bytes = 0;
    uint64_t samples = 0;
  };

  // A stream thread, of its shuffle buffer: what it holds now and its own
  // peaks; `last` is updated to `now`. The figures add the streams' buffers
  // up: shuffle_bytes is their total now, and each peak the largest total
  // seen at a report or the largest one buffer reached, whichever is larger.
  void shuffle(ShuffleLevel& last, const ShuffleLevel& now, uint64_t peak_bytes,
               uint64_t peak_samples) {
    // Unsigned arithmetic wraps: adding (now - last) works when it shrinks too.
    const uint64_t add_bytes = now.bytes - last.bytes;
    const uint64_t add_samples = now.samples - last.samples;
    const uint64_t bytes = shuffle_bytes_.fetch_add(add_bytes) + add_bytes;
    const uint64_t samples = shuffle_samples_.fetch_add(add_samples) + add_samples;
    last = now;
    raise_to(shuffle_peak_bytes_, std::max(bytes, peak_bytes));
    raise_to(shuffle_peak_samples_, std::max(samples, peak_samples));
  }

  // The assembler, of a batch it hands to the decode threads.
  void batch_submitted(size_t samples) {
    samples_batched_.fetch_add(samples);
    batches_submitted_.fetch_add(1);
  }
  // ... and of the samples of a batch it delivers from a pass after the
  // first (StreamPlan::repeat_to_limit).
  void samples_repeated(size_t samples) { samples_repeated_.fetch_add(samples); }

  // The counters' part of `s`.
  void fill(EngineStats& s) const {
    s.batches_submitted = batches_submitted_.load();
    s.samples_read = samples_read_.load();
    s.samples_batched = samples_batched_.load();
    s.samples_repeated = samples_repeated_.load();
    s.shards_opened = shards_opened_.load();
    s.encoded_bytes = encoded_bytes_.load();
    s.read_ns = read_ns_.load();
    s.shuffle_bytes = shuffle_bytes_.load();
    s.shuffle_peak_bytes = shuffle_peak_bytes_.load();
    s.shuffle_peak_samples = shuffle_peak_samples_.load();
  }

 private:
  static void raise_to(std::atomic<uint64_t>& target, uint64_t value) {
    uint64_t current = target.load(std::memory_order_relaxed);
    while (value > current && !target.compare_exchange_weak(current, value)) {
    }
  }

  std::atomic<uint64_t> shards_opened_{0}, samples_read_{0}, samples_batched_{0},
      samples_repeated_{0}, batches_submitted_{0}, encoded_bytes_{0}, read_ns_{0},
      shuffle_bytes_{0}, shuffle_samples_{0}, shuffle_peak_bytes_{0}, shuffle_peak_samples_{0};
};

}  // namespace chute

// The counters both engines report, under one set of names: the bindings
// turn this struct into the dict stats() returns, the same keys from either
// engine; a counter that does not apply to an engine stays 0.
//
//   batches, samples_yielded, bytes_yielded: batches handed to the consumer,
//       their rows and the bytes of their tensors
//   batches_submitted: batches handed to the workers (stream: formed by the
//       assembler; indexed: submitted by the caller)
//   queued_batches: finished, waiting for the consumer
//   samples_read: stream: samples grouped from the shards; indexed: rows
//       gathered from the sources
//   samples_skipped: samples dropped under the skip policy (stream)
//   samples_batched: samples placed in a batch (indexed: rows submitted)
//   samples_repeated: of those, the samples of the batches delivered here
//       from a pass over the shards after the first, read again to reach the
//       plan's limit (stream, StreamPlan::repeat_to_limit)
//   shards_opened, encoded_bytes: shards opened and payload bytes read (stream)
//   read_seconds: stream: busy time of the parse threads, which read shards,
//       group members into samples and probe their headers
//   decode_seconds: busy time of the batch workers, which decode samples
//       (stream) or gather rows (indexed) into batch memory
//   shuffle_bytes, shuffle_peak_bytes, shuffle_peak_samples: the bytes of
//       the samples in the shuffle buffers now, as the buffers count them
//       (EncodedSample::encoded_bytes), added up over the streams, and the
//       peaks of that total (stream; see StreamCounters::shuffle)
//   arenas_created, batch_bytes_reserved, batch_bytes_in_use,
//   batch_peak_bytes_reserved, batch_peak_bytes_in_use, batch_bytes_pinned:
//       the batch memory (see memory/batch_allocator.h)
//   transform_ns: the part of decode_ns spent in image transforms (resize,
//       crop, flip, layout and dtype writes; core/transform_clock.h)
//   decode_active_ns, decode_blocked_ns: worker-time the active batch
//       workers had, and the part they waited for a slot in the results
//       (the rest of it beyond decode_ns: waiting for work)
//   decode_threads, prefetch_batches: batch workers allowed to work now and
//       the batches in flight allowed now (set_active_threads)
//   ready_seen, consumer_waits: the batches ready each time the consumer
//       took one, added up, and the batches it had to wait for
//   cache_corrupt_refetches: node-cache entries whose bytes failed their
//       checksum and were fetched again (counted by the byte sources, which
//       the engine does not see: filled in by the bindings; stream)
#pragma once

#include <atomic>
#include <cstdint>

#include "batching/batch.h"
#include "batching/ordered_results.h"
#include "batching/piece_scheduler.h"
#include "memory/batch_allocator.h"

namespace chute {

struct EngineStats {
  uint64_t batches = 0;
  uint64_t samples_yielded = 0;
  uint64_t bytes_yielded = 0;
  uint64_t batches_submitted = 0;
  int64_t queued_batches = 0;
  uint64_t samples_read = 0;
  uint64_t samples_skipped = 0;
  uint64_t samples_batched = 0;
  uint64_t samples_repeated = 0;
  uint64_t shards_opened = 0;
  uint64_t encoded_bytes = 0;
  uint64_t read_ns = 0;
  uint64_t decode_ns = 0;
  uint64_t transform_ns = 0;
  uint64_t decode_active_ns = 0;
  uint64_t decode_blocked_ns = 0;
  int64_t decode_threads = 0;
  int64_t prefetch_batches = 0;
  uint64_t ready_seen = 0;
  uint64_t consumer_waits = 0;
  uint64_t shuffle_bytes = 0;
  uint64_t shuffle_peak_bytes = 0;
  uint64_t shuffle_peak_samples = 0;
  uint64_t cache_corrupt_refetches = 0;
  AllocatorStats memory;
};

// The batch workers' and the results queue's part of `s`.
inline void fill_worker_figures(const PieceScheduler& workers, const OrderedResults& results,
                                EngineStats& s) {
  s.decode_ns = workers.busy_ns();
  s.transform_ns = workers.transform_ns();
  s.decode_active_ns = workers.active_ns();
  s.decode_blocked_ns = workers.blocked_ns();
  s.decode_threads = workers.active_workers();
  s.prefetch_batches = results.max_in_flight();
  const OrderedResults::Occupancy occupancy = results.occupancy();
  s.ready_seen = occupancy.ready_seen;
  s.consumer_waits = occupancy.waits;
}

// What reached the consumer, counted by an engine's next().
class DeliveryCounter {
 public:
  void count(const Batch& batch) {
    batches_.fetch_add(1, std::memory_order_relaxed);
    rows_.fetch_add(static_cast<uint64_t>(batch.size), std::memory_order_relaxed);
    bytes_.fetch_add(batch.tensor_bytes(), std::memory_order_relaxed);
  }
  void fill(EngineStats& s) const {
    s.batches = batches_.load(std::memory_order_relaxed);
    s.samples_yielded = rows_.load(std::memory_order_relaxed);
    s.bytes_yielded = bytes_.load(std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> batches_{0}, rows_{0}, bytes_{0};
};

}  // namespace chute

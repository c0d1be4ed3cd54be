// The stream engine: the urls of a plan → samples → shuffle → batches, on
// native threads. It knows sources and codecs only through the plan's
// interfaces (sources/sample_source.h, sources/field_decoder.h).
//
//   parse threads (up to parse_ahead per stream): each reads one shard,
//     groups members into samples, resolves and probes each field (headers
//     only);
//   stream threads (one per logical stream): take the parsed shards in
//     order, shuffle encoded samples, hand them on in chunks;
//   assembler thread: takes batch_size samples from the streams in
//     round-robin order, numbers the batch, checks that stacked fields agree
//     in shape, and queues it;
//   decode threads: decode every field of a batch straight into its row of
//     the batch buffers, in pieces of rows that any of them may take
//     (batching/piece_scheduler.h);
//   consumer (Python, in next()): receives batches in number order.
//
// A plan that repeats to its limit (StreamPlan::repeat_to_limit) reads the
// shard list pass after pass: each stream thread, at the end of a pass,
// drains its shuffle buffer, marks the end, and waits until the assembler,
// having formed the pass's last batches from every stream, asks for the next.
//
// Order depends only on the plan (seed, epoch, streams), never on how many
// decode threads run or how fast they are.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "batching/batch.h"
#include "batching/ordered_results.h"
#include "batching/piece_scheduler.h"
#include "batching/sample_fields.h"
#include "batching/skip_log.h"
#include "batching/stream_batch.h"
#include "engine/bounded_queue.h"
#include "engine/engine_stats.h"
#include "engine/sample_chunk.h"
#include "engine/stream_counters.h"
#include "engine/stream_plan.h"
#include "engine/thread_group.h"
#include "memory/batch_allocator.h"
#include "memory/byte_buffer_pool.h"

namespace chute {

class StreamEngine {
 public:
  explicit StreamEngine(StreamPlan plan);
  ~StreamEngine();
  StreamEngine(const StreamEngine&) = delete;
  StreamEngine& operator=(const StreamEngine&) = delete;

  // Next batch in order. kEnd when the epoch is over; rethrows the error of
  // the batch at this position. timeout_s <= 0 waits forever.
  OrderedResults::Status next(Batch* out, double timeout_s);

  // Stops all threads promptly and joins them; later next() calls return
  // kClosed.
  void close();

  EngineStats stats() const;
  // At most `threads` decode threads work from now on (of the plan's
  // num_threads), with `in_flight` batches in flight: the batches and
  // their order stay those of the plan.
  void set_active_threads(int threads, int64_t in_flight);
  // Batches formed so far, those a resume skips (StreamPlan::skip_batches)
  // included; once next() returned kEnd, the epoch's batch count.
  int64_t batches_formed() const { return batches_formed_.load(); }
  // Errors of the samples skipped since the last call (for Python's handler).
  std::vector<SkippedSample> take_skipped() { return skips_.take(); }
  BatchAllocator& allocator() { return allocator_; }

 private:
  struct ShardJob;

  void run_stream(int stream);
  void parse_shard(ShardJob& job, size_t chunk_size);
  void run_assembler();
  // False once the engine closed (the task is dropped).
  bool queue_for_decoding(BatchTask&& task);
  // A sample skipped before decoding (every process worker forms every
  // batch, see StreamPlan::deliver_stride): logged by one engine only.
  void record_formation_skip(const Error& error, uint64_t samples_lost = 1);
  // Whether the batch formed `absolute`-th is decoded and delivered here
  // (not skipped by a resume, and this process worker's).
  bool delivers(int64_t absolute) const;

  const StreamPlan plan_;
  const SampleDecoding sample_decoding_;
  const SampleFields fields_{sample_decoding_};
  BatchAllocator allocator_;
  ByteBufferPool payload_buffers_{size_t{64} << 20, size_t{4} << 20};
  OrderedResults results_;
  PieceScheduler decoding_{results_};
  SkipLog skips_;
  const StreamBatchContext batch_context_{&sample_decoding_, &fields_, &allocator_, &skips_,
                                          &payload_buffers_};
  std::vector<std::unique_ptr<BoundedQueue<SampleChunk>>> stream_queues_;
  // Per stream, the next pass the assembler asks it to read (repeat_to_limit);
  // closed when the epoch ends.
  std::vector<std::unique_ptr<BoundedQueue<int64_t>>> pass_requests_;
  std::atomic<bool> closed_{false};
  std::atomic<int64_t> batches_formed_{0};

  DeliveryCounter delivered_;
  StreamCounters counters_;

  ThreadGroup threads_;  // last: joined before the members above are destroyed
};

}  // namespace chute

// Gathers batches of rows by index on a pool of native threads, from row
// sources (fixed-shape rows: HDF5, arrays) or, in sample mode, from an
// indexed sample source whose samples the field decoders decode into
// columns exactly as the stream engine's batches are decoded
// (batching/stream_batch.h). The caller submits index batches; each batch
// is cut into pieces of rows that any worker may take
// (batching/piece_scheduler.h), so one large batch still uses every core,
// while small batches stay whole and several run side by side. Every piece
// writes its rows straight into their final slot of the batch's tensors, and
// batches come back in submission order (row i of a batch is index i).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "batching/batch.h"
#include "batching/ordered_results.h"
#include "batching/piece_scheduler.h"
#include "batching/sample_decoding.h"
#include "batching/sample_fields.h"
#include "batching/skip_log.h"
#include "batching/stream_batch.h"
#include "engine/engine_stats.h"
#include "engine/thread_group.h"
#include "memory/batch_allocator.h"
#include "memory/byte_buffer_pool.h"
#include "sources/indexed_sample_source.h"
#include "sources/row_source.h"

namespace chute {

struct IndexedPlan {
  // One per output field, all with the same number of rows.
  std::vector<std::shared_ptr<RowSource>> sources;
  // The dataset's rows, when the caller knows them (-1: the sources'). It
  // bounds the indices when no source does: a dataset whose every field is
  // read outside the engine still has rows. Sources must agree with it.
  int64_t num_rows = -1;
  // Sample mode, instead of `sources`: samples read by id from `samples`
  // and decoded as `decoding` says (its `locate` is the source's). A stacked
  // field whose rows differ in shape within a batch comes out as a list of
  // tensors for that batch; rows that fail follow decoding.on_error.
  std::shared_ptr<const IndexedSampleSource> samples;
  SampleDecoding decoding;
  // 0: no threads; next() makes the oldest batch on the caller's thread,
  // whole (one piece), with no hand-off between threads. For batches whose
  // work is little more than copies, the hand-offs cost more than the work.
  // (A source whose samples wait for their bytes, wait_readable, needs
  // threads: next() would wait for them without its timeout.)
  int num_threads = 1;
  // Batches started ahead of the consumer: bounds the batch memory alive.
  int max_in_flight = 1;
  // Rows per piece; 0 picks it from the row size (see indexed_engine.cc).
  int64_t piece_rows = 0;
  PinHooks pin;  // page-lock batch memory (see memory/batch_allocator.h)
};

class IndexedEngine {
 public:
  explicit IndexedEngine(IndexedPlan plan);
  ~IndexedEngine();
  IndexedEngine(const IndexedEngine&) = delete;
  IndexedEngine& operator=(const IndexedEngine&) = delete;

  // Queues a batch of global row indices (copied); returns its sequence
  // number. Never blocks: the caller bounds how far ahead it submits, and
  // workers do not start a batch more than max_in_flight ahead of the consumer.
  // In sample mode a decoder's random draws for sample i derive from (seed,
  // epoch, i).
  int64_t submit(const int64_t* indices, size_t n, int64_t epoch = 0);

  // The next batch in submission order (made here when the plan has no
  // threads); kTimeout when timeout_s (> 0) passes first. Rethrows a worker's error at its batch's position; throws
  // kUsage after close() or when nothing is outstanding.
  OrderedResults::Status next(Batch* out, double timeout_s);

  // An engine without threads: the batch of `indices`, made on this thread
  // (submit() and next() in one call). Nothing may be outstanding.
  void gather(const int64_t* indices, size_t n, Batch* out);

  // Stops the workers promptly (queued batches are dropped) and joins them.
  void close();

  int64_t num_rows() const { return num_rows_; }
  int64_t outstanding() const;
  EngineStats stats() const;
  // At most `threads` workers gather from now on (of the plan's
  // num_threads), with `in_flight` batches started ahead of the consumer;
  // the batches and their order stay those of the submissions.
  void set_active_threads(int threads, int64_t in_flight);
  // Sample mode: errors of the samples skipped since the last call.
  std::vector<SkippedSample> take_skipped() { return skips_.take(); }

 private:
  class GatherJob;
  class SampleJob;

  const IndexedPlan plan_;
  int64_t num_rows_ = 0;
  int64_t piece_rows_ = 0;
  BatchAllocator allocator_;
  // Sample mode's parts (unused with row sources).
  SampleDecoding sample_decoding_;
  SampleFields fields_{sample_decoding_};
  SkipLog skips_;
  ByteBufferPool payload_buffers_{0, 0};  // samples are read in place: no payload buffers
  StreamBatchContext batch_context_{&sample_decoding_, &fields_, &allocator_, &skips_,
                                    &payload_buffers_};
  OrderedResults results_;
  PieceScheduler gathering_{results_};

  mutable std::mutex mutex_;
  int64_t next_sequence_ = 0;  // guarded by mutex_, as is closed_
  bool closed_ = false;
  // Set by close(): the remote reads its threads make (core/read_cancel.h)
  // give up, so that closing does not join behind a stalled server.
  std::atomic<bool> cancel_reads_{false};

  // Set by close(), before it joins the workers: a worker waiting for
  // its samples to become readable (IndexedSampleSource::wait_readable) gives up.
  std::atomic<bool> closing_{false};
  DeliveryCounter delivered_;
  std::atomic<uint64_t> rows_submitted_{0};
  std::atomic<uint64_t> rows_read_{0};

  ThreadGroup threads_;  // last: joined before the members above are destroyed
};

}  // namespace chute

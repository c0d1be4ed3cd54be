// Gathers batches of rows by index from row sources on a pool of native
// threads. The caller submits index batches; each batch is cut into pieces of
// rows that any worker may take, so one large batch still uses every core,
// while small batches stay whole and several run side by side. Every piece
// writes its rows straight into their final slot of the batch's tensors, and
// batches come back in submission order (row i of a batch is index i).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "memory/batch_allocator.h"
#include "pipeline/batch.h"
#include "pipeline/ordered_results.h"
#include "pipeline/row_source.h"
#include "pipeline/thread_group.h"

namespace chute {

struct IndexedEngineStats {
  uint64_t batches = 0;     // delivered to the consumer
  uint64_t rows = 0;        // in delivered batches
  uint64_t bytes = 0;       // of delivered batch tensors
  uint64_t source_bytes_read = 0;
  int64_t submitted = 0;
  AllocatorStats allocator;
};

class IndexedEngine {
 public:
  // All fields must have the same number of rows. `piece_rows` 0 picks a
  // piece size from the row size (see indexed_engine.cc).
  IndexedEngine(std::vector<std::shared_ptr<RowSource>> fields, int num_threads,
                int max_in_flight, int64_t piece_rows = 0);
  ~IndexedEngine();
  IndexedEngine(const IndexedEngine&) = delete;
  IndexedEngine& operator=(const IndexedEngine&) = delete;

  // Queues a batch of global row indices (copied); returns its sequence
  // number. Never blocks: the caller bounds how far ahead it submits, and
  // workers do not start a batch more than max_in_flight ahead of the consumer.
  int64_t submit(const int64_t* indices, size_t n);

  // The next batch in submission order. False on timeout (timeout_s > 0).
  // Rethrows a worker's error at its batch's position; throws kUsage after
  // close() or when nothing is outstanding.
  bool next(Batch* out, double timeout_s);

  // Stops the workers promptly (queued batches are dropped) and joins them.
  void close();

  int64_t num_rows() const { return num_rows_; }
  int64_t outstanding() const;
  IndexedEngineStats stats() const;
  BatchAllocator& allocator() { return allocator_; }

 private:
  struct Task;
  void worker();
  void run_piece(Task& task, int64_t piece);
  void allocate(Task& task);

  std::vector<std::shared_ptr<RowSource>> fields_;
  int64_t num_rows_ = 0;
  int64_t piece_rows_ = 0;
  BatchAllocator allocator_;
  OrderedResults results_;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::deque<std::shared_ptr<Task>> queue_;  // batches with pieces not yet taken
  int64_t next_sequence_ = 0;
  bool closed_ = false;

  std::atomic<uint64_t> delivered_batches_{0};
  std::atomic<uint64_t> delivered_rows_{0};
  std::atomic<uint64_t> delivered_bytes_{0};

  ThreadGroup threads_;  // last: joined before the members above are destroyed
};

}  // namespace chute

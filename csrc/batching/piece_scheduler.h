// Rows of batches cut into pieces that any worker thread takes, oldest batch
// first, so every worker helps with the batch the consumer waits for (the
// first batch arrives sooner, and the last one does not leave workers idle),
// while batches too small to split still run side by side. The first worker
// to take a piece of a batch allocates it (which may include reading its
// samples), the last to finish one delivers it to OrderedResults. While a
// batch is being allocated, the other workers take pieces of the batches
// after it rather than wait. Both engines run their batches through this; what a
// batch is and how its rows are made is the job's business (PieceJob).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>

#include "batching/batch.h"
#include "batching/ordered_results.h"

namespace chute {

class PieceJob {
 public:
  // A batch of `rows` rows, numbered `sequence` in delivery order, cut into
  // pieces of `piece_rows` rows.
  PieceJob(int64_t sequence, size_t rows, size_t piece_rows);
  virtual ~PieceJob() = default;
  PieceJob(const PieceJob&) = delete;
  PieceJob& operator=(const PieceJob&) = delete;

  int64_t sequence() const { return sequence_; }
  size_t rows() const { return rows_; }

 protected:
  // Once, by the first worker to take a piece, before any run(). A throw
  // loses the batch (it is delivered as that error). Other workers run
  // pieces of later batches meanwhile.
  virtual void allocate() = 0;
  // Makes rows [begin, end) of batch_; pieces of one batch run concurrently
  // on disjoint rows. A throw fails the batch as if row `begin` failed.
  virtual void run(size_t begin, size_t end) = 0;
  // Once, by the thread that delivers the batch (the one that finished its
  // last piece), unless the batch failed: the last change to batch_.
  virtual void finish() {}

  // Row `row` failed: the batch fails with the error of its lowest failing
  // row, whichever worker finds it, so the error does not depend on the
  // thread count. Rows after it need no work (see stop_row()).
  void fail(size_t row, std::exception_ptr error);
  // Rows at or past this one need not be made: an earlier row failed.
  size_t stop_row() const { return stop_row_.load(std::memory_order_relaxed); }

  Batch batch_;  // delivered once every piece is done

 private:
  friend class PieceScheduler;
  void lose(std::exception_ptr error);  // the whole batch, before any row

  const int64_t sequence_;
  const size_t rows_;
  const size_t piece_rows_;
  const size_t num_pieces_;
  size_t next_piece_ = 0;            // guarded by the scheduler's mutex, as are the two below
  bool allocation_started_ = false;  // a worker took the first piece and allocates
  bool allocating_ = false;          // ... and has not finished: its pieces wait
  std::atomic<size_t> remaining_;    // pieces not finished
  std::mutex error_mutex_;
  std::exception_ptr error_;
  size_t error_row_ = SIZE_MAX;
  std::atomic<size_t> stop_row_{SIZE_MAX};
};

class PieceScheduler {
 public:
  // Delivers into `results`. A piece starts only once its batch has a slot
  // there (fewer than max_in_flight batches ahead of the consumer), which
  // bounds the batch memory alive at once.
  explicit PieceScheduler(OrderedResults& results) : results_(results) {}
  PieceScheduler(const PieceScheduler&) = delete;
  PieceScheduler& operator=(const PieceScheduler&) = delete;

  // Queues a batch; one without rows is delivered at once. False once
  // closed (the job is dropped).
  bool push(std::shared_ptr<PieceJob> job);
  // No more batches: workers return once every queued piece is taken.
  void end();
  // Drops the queued batches; workers return after the piece they run.
  void close();
  // A worker thread's loop: takes and runs pieces until end() or close().
  void work();
  // For a scheduler without worker threads: runs every piece of the oldest
  // queued batch on the calling thread and delivers it (once it has a slot
  // in the results). False when nothing is queued (or after close()).
  bool run_oldest();

  // At most `limit` (at least 1) workers take pieces from now on; the others
  // wait, after the piece they run, until the limit lets them in again.
  // Pieces go out oldest batch first whichever worker takes them, so the
  // limit changes how fast batches are made, never what they hold.
  void set_active_limit(int limit);
  // The workers that may take pieces (the limit, or fewer workers); what
  // it was at the end once they returned.
  int active_workers() const;

  // Time workers spent running pieces, summed over workers.
  uint64_t busy_ns() const { return busy_ns_.load(std::memory_order_relaxed); }
  // The part of busy_ns spent in image transforms (core/transform_clock.h).
  uint64_t transform_ns() const { return transform_ns_.load(std::memory_order_relaxed); }
  // Time workers waited for a batch to have a slot in the results (the
  // consumer or the bytes in flight held them back).
  uint64_t blocked_ns() const { return blocked_ns_.load(std::memory_order_relaxed); }
  // Worker-nanoseconds the active workers had, from each worker's start:
  // busy, blocked or waiting for pieces (idle: nothing to decode yet).
  uint64_t active_ns() const;

 private:
  void run_piece(PieceJob& job, size_t piece, bool allocate);
  void deliver(PieceJob& job);

  OrderedResults& results_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::deque<std::shared_ptr<PieceJob>> queue_;  // batches with pieces not yet taken
  bool ended_ = false;
  bool closed_ = false;
  // Guarded by mutex_, as are the four below: workers that entered work()
  // (each numbered in turn), those still in it, and how many may take pieces.
  int workers_ = 0;
  int running_ = 0;
  int active_limit_ = std::numeric_limits<int>::max();
  uint64_t active_ns_ = 0;      // worker-nanoseconds up to active_since_ns_
  uint64_t active_since_ns_ = 0;
  std::atomic<uint64_t> busy_ns_{0};
  std::atomic<uint64_t> transform_ns_{0};
  std::atomic<uint64_t> blocked_ns_{0};

  // Adds the active workers' time since the last change; under mutex_.
  void account_active(uint64_t now);
};

}  // namespace chute

#include "batching/piece_scheduler.h"

#include <algorithm>

#include "core/clock.h"
#include "core/transform_clock.h"

namespace chute {

PieceJob::PieceJob(int64_t sequence, size_t rows, size_t piece_rows)
    : sequence_(sequence),
      rows_(rows),
      piece_rows_(std::max<size_t>(1, piece_rows)),
      num_pieces_((rows + piece_rows_ - 1) / piece_rows_),
      remaining_(num_pieces_) {}

void PieceJob::fail(size_t row, std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (row < error_row_) {
    error_ = std::move(error);
    error_row_ = row;
    stop_row_.store(row + 1, std::memory_order_relaxed);
  }
}

void PieceJob::lose(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (!error_) {
    error_ = std::move(error);
    error_row_ = 0;
  }
  stop_row_.store(0, std::memory_order_relaxed);
}

bool PieceScheduler::push(std::shared_ptr<PieceJob> job) {
  if (job->num_pieces_ == 0) {  // nothing for a worker to do
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return false;
    }
    try {
      job->allocate();
    } catch (...) {
      job->lose(std::current_exception());
    }
    deliver(*job);
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return false;
    queue_.push_back(std::move(job));
  }
  work_cv_.notify_all();
  return true;
}

void PieceScheduler::end() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ended_ = true;
  }
  work_cv_.notify_all();
}

void PieceScheduler::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    queue_.clear();
  }
  work_cv_.notify_all();
}

void PieceScheduler::account_active(uint64_t now) {
  if (active_since_ns_ != 0) {
    active_ns_ += static_cast<uint64_t>(std::min(running_, active_limit_)) *
                  (now - active_since_ns_);
  }
  active_since_ns_ = now;
}

void PieceScheduler::set_active_limit(int limit) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    account_active(now_ns());
    active_limit_ = std::max(1, limit);
  }
  work_cv_.notify_all();
}

int PieceScheduler::active_workers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::min(workers_, active_limit_);
}

uint64_t PieceScheduler::active_ns() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t since = active_since_ns_ == 0 ? 0 : now_ns() - active_since_ns_;
  return active_ns_ + static_cast<uint64_t>(std::min(running_, active_limit_)) * since;
}

void PieceScheduler::work() {
  // The oldest batch with a piece left that is not being allocated.
  auto ready = [this] {
    return std::find_if(queue_.begin(), queue_.end(),
                        [](const std::shared_ptr<PieceJob>& j) { return !j->allocating_; });
  };
  int index = 0;  // workers numbered at or past the active limit wait
  {
    std::lock_guard<std::mutex> lock(mutex_);
    account_active(now_ns());
    index = workers_++;
    running_ += 1;
  }
  // However the loop ends, this worker's time stops counting as active.
  struct Leaving {
    PieceScheduler& scheduler;
    ~Leaving() {
      std::lock_guard<std::mutex> lock(scheduler.mutex_);
      scheduler.account_active(now_ns());
      scheduler.running_ -= 1;
    }
  } leaving{*this};
  // The batch this worker allocated last: a worker past the limit still
  // runs its pieces, for the workers within it may all be waiting for slots
  // of later batches, which only this one's delivery frees.
  std::shared_ptr<PieceJob> own;
  auto own_left = [&] { return own != nullptr && own->next_piece_ < own->num_pieces_; };
  while (true) {
    std::shared_ptr<PieceJob> job;
    size_t piece = 0;
    bool allocate = false;
    bool drained = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] {
        if (queue_.empty()) return ended_ || closed_;
        return index < active_limit_ ? ready() != queue_.end() : own_left();
      });
      if (queue_.empty()) return;  // ended (or closed) and drained
      const auto it =
          index < active_limit_ ? ready() : std::find(queue_.begin(), queue_.end(), own);
      job = *it;
      piece = job->next_piece_++;
      if (job->next_piece_ == job->num_pieces_) queue_.erase(it);
      allocate = !job->allocation_started_;
      job->allocation_started_ = true;
      job->allocating_ = allocate;
      if (allocate) {
        own = job;
      } else if (!own_left()) {
        own.reset();
      }
      // Workers held back by the limit wait for the queue to empty once
      // the batches ended: nothing else would wake them.
      drained = ended_ && queue_.empty();
    }
    if (drained) work_cv_.notify_all();
    const uint64_t t_slot = now_ns();
    if (!results_.wait_for_slot(job->sequence_)) return;  // closed
    const uint64_t t0 = now_ns();
    blocked_ns_.fetch_add(t0 - t_slot, std::memory_order_relaxed);
    const uint64_t transform_before = thread_transform_ns();
    run_piece(*job, piece, allocate);
    busy_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
    transform_ns_.fetch_add(thread_transform_ns() - transform_before, std::memory_order_relaxed);
    if (job->remaining_.fetch_sub(1) == 1) deliver(*job);
  }
}

bool PieceScheduler::run_oldest() {
  std::shared_ptr<PieceJob> job;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queue_.empty() || closed_) return false;
    job = std::move(queue_.front());
    queue_.pop_front();
    job->allocation_started_ = true;
    job->next_piece_ = job->num_pieces_;
  }
  if (!results_.wait_for_slot(job->sequence_)) return false;
  const uint64_t t0 = now_ns();
  const uint64_t transform_before = thread_transform_ns();
  for (size_t piece = 0; piece < job->num_pieces_; ++piece) run_piece(*job, piece, piece == 0);
  busy_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
  transform_ns_.fetch_add(thread_transform_ns() - transform_before, std::memory_order_relaxed);
  job->remaining_.store(0, std::memory_order_relaxed);
  deliver(*job);
  return true;
}

void PieceScheduler::run_piece(PieceJob& job, size_t piece, bool allocate) {
  const size_t begin = piece * job.piece_rows_;
  const size_t end = std::min(job.rows_, begin + job.piece_rows_);
  if (allocate) {
    try {
      job.allocate();
    } catch (...) {
      job.lose(std::current_exception());  // out of memory, or its samples unreadable
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job.allocating_ = false;
    }
    work_cv_.notify_all();  // its other pieces may start
  }
  if (begin >= job.stop_row()) return;
  try {
    job.run(begin, end);
  } catch (...) {
    job.fail(begin, std::current_exception());
  }
}

void PieceScheduler::deliver(PieceJob& job) {
  std::exception_ptr error;
  {
    // Moved out: the consumer's thread then frees it (see stream_engine.cc's
    // parse_shard), not whichever thread drops the job last.
    std::lock_guard<std::mutex> lock(job.error_mutex_);
    error = std::move(job.error_);
  }
  if (!error) {
    try {
      job.finish();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) {
    results_.put_error(job.sequence_, std::move(error));
    return;
  }
  job.batch_.sequence = job.sequence_;
  results_.put(job.sequence_, std::move(job.batch_));
}

}  // namespace chute

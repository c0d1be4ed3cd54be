// Hands finished batches to the consumer in sequence order, whatever order
// the worker threads finish them in, and bounds how many batches may be in
// flight (assigned but not yet consumed). A worker's exception is stored at
// its batch's position and rethrown by next() when the consumer gets there,
// so errors surface deterministically.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>

#include "pipeline/batch.h"

namespace chute {

class OrderedResults {
 public:
  enum class Status { kBatch, kEnd, kTimeout, kClosed };

  explicit OrderedResults(int64_t max_in_flight) : max_in_flight_(max_in_flight < 1 ? 1 : max_in_flight) {}

  // Producer: blocks until batch `sequence` may start (fewer than
  // max_in_flight batches ahead of the consumer). False once closed.
  bool wait_for_slot(int64_t sequence) {
    std::unique_lock<std::mutex> lock(mutex_);
    slot_free_.wait(lock, [&] { return closed_ || sequence < consumed_ + max_in_flight_; });
    return !closed_;
  }

  void put(int64_t sequence, Batch batch) {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_[sequence].batch = std::move(batch);
    ready_cv_.notify_all();
  }

  void put_error(int64_t sequence, std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_[sequence].error = std::move(error);
    ready_cv_.notify_all();
  }

  // No batch numbered >= total will come.
  void finish(int64_t total) {
    std::lock_guard<std::mutex> lock(mutex_);
    total_ = total;
    ready_cv_.notify_all();
  }

  // Consumer. timeout_s <= 0 waits forever. Rethrows a worker's error.
  Status next(Batch* out, double timeout_s) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto ready = [&] {
      return closed_ || ready_.count(consumed_) != 0 || (total_ >= 0 && consumed_ >= total_);
    };
    if (timeout_s > 0) {
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(timeout_s));
      if (!ready_cv_.wait_until(lock, deadline, ready)) return Status::kTimeout;
    } else {
      ready_cv_.wait(lock, ready);
    }
    if (closed_) return Status::kClosed;
    auto it = ready_.find(consumed_);
    if (it == ready_.end()) return Status::kEnd;
    Entry entry = std::move(it->second);
    ready_.erase(it);
    consumed_ += 1;
    slot_free_.notify_all();
    lock.unlock();
    if (entry.error) std::rethrow_exception(entry.error);
    *out = std::move(entry.batch);
    return Status::kBatch;
  }

  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    ready_cv_.notify_all();
    slot_free_.notify_all();
  }

  int64_t consumed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return consumed_;
  }

  int64_t ready_count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(ready_.size());
  }

 private:
  struct Entry {
    Batch batch;
    std::exception_ptr error;
  };
  mutable std::mutex mutex_;
  std::condition_variable ready_cv_;
  std::condition_variable slot_free_;
  std::map<int64_t, Entry> ready_;
  int64_t max_in_flight_;
  int64_t consumed_ = 0;
  int64_t total_ = -1;
  bool closed_ = false;
};

}  // namespace chute

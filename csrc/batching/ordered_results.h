// Hands finished batches to the consumer in sequence order, whatever order
// the worker threads finish them in, and bounds how many batches may be in
// flight (assigned but not yet consumed), in batches and, when asked, in
// bytes. A worker's exception is stored at
// its batch's position and rethrown by next() when the consumer gets there,
// so errors surface deterministically.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>

#include "batching/batch.h"

namespace chute {

class OrderedResults {
 public:
  enum class Status { kBatch, kEnd, kTimeout, kClosed };

  // max_bytes > 0 also bounds the bytes of the batches in flight (as their
  // producer states them); a batch larger than that still goes when nothing
  // else is in flight.
  explicit OrderedResults(int64_t max_in_flight, uint64_t max_bytes = 0)
      : max_in_flight_(max_in_flight < 1 ? 1 : max_in_flight), max_bytes_(max_bytes) {}

  // Producer: blocks until batch `sequence`, which will hold `bytes`, may
  // start (fewer than max_in_flight batches ahead of the consumer, and room
  // for its bytes). A caller that states no bytes (a worker of a batch
  // already admitted) waits for the batch count only. False once closed.
  bool wait_for_slot(int64_t sequence, uint64_t bytes = 0) {
    std::unique_lock<std::mutex> lock(mutex_);
    slot_free_.wait(lock, [&] {
      return closed_ || (sequence < consumed_ + max_in_flight_ &&
                         (bytes == 0 || max_bytes_ == 0 || bytes_in_flight_ == 0 ||
                          bytes_in_flight_ + bytes <= max_bytes_));
    });
    if (closed_) return false;
    if (bytes > 0) {
      bytes_of_[sequence] = bytes;
      bytes_in_flight_ += bytes;
    }
    return true;
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
    // A wait is counted once per batch, however many timed calls it takes.
    if (!ready() && waited_for_ != consumed_) {
      waited_for_ = consumed_;
      waits_ += 1;
    }
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
    ready_seen_ += ready_.size();
    Entry entry = std::move(it->second);
    ready_.erase(it);
    const auto held = bytes_of_.find(consumed_);
    if (held != bytes_of_.end()) {
      bytes_in_flight_ -= held->second;
      bytes_of_.erase(held);
    }
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

  // The batch the consumer takes next is there (or its error).
  bool next_ready() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return ready_.count(consumed_) != 0;
  }

  // Batches in flight at most from now on (at least 1); producers already
  // admitted go on, the next wait for the new bound.
  void set_max_in_flight(int64_t max_in_flight) {
    std::lock_guard<std::mutex> lock(mutex_);
    max_in_flight_ = max_in_flight < 1 ? 1 : max_in_flight;
    slot_free_.notify_all();
  }

  int64_t max_in_flight() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return max_in_flight_;
  }

  // How full the queue was for the consumer: the batches ready when it
  // took each one (that one included), added up, and how many batches it
  // had to wait for.
  struct Occupancy {
    uint64_t ready_seen = 0;
    uint64_t waits = 0;
  };
  Occupancy occupancy() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {ready_seen_, waits_};
  }

  int64_t ready_count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(ready_.size());
  }

  uint64_t bytes_in_flight() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_in_flight_;
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
  uint64_t max_bytes_;
  std::map<int64_t, uint64_t> bytes_of_;  // of the batches in flight that stated any
  uint64_t bytes_in_flight_ = 0;
  int64_t consumed_ = 0;
  int64_t total_ = -1;
  bool closed_ = false;
  uint64_t ready_seen_ = 0;
  uint64_t waits_ = 0;
  int64_t waited_for_ = -1;  // the batch whose wait was counted last
};

}  // namespace chute

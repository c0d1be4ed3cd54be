// A fetcher for unit tests: serves one object from memory on a FetchQueue,
// as chute.remote's executor serves a store.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "io/fetch_queue.h"

namespace chute::test {

// Serves one object (`data`, its ETag `etag`) and records every request it
// answers.
class MemoryStore {
 public:
  struct Seen {
    FetchOp op;
    uint64_t offset;
    uint64_t length;
    std::string if_match;
  };

  MemoryStore(std::shared_ptr<FetchQueue> queue, std::string data, std::string etag)
      : queue_(std::move(queue)), data_(std::move(data)), etag_(std::move(etag)) {
    thread_ = std::thread([this] { serve(); });
  }
  ~MemoryStore() {
    stop_ = true;
    thread_.join();
  }
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  // Ranges starting at `offset` fail for good with `status`.
  void fail_at(uint64_t offset, int status) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_offset_ = offset;
    fail_status_ = status;
  }

  std::vector<Seen> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  void serve() {
    while (!stop_) {
      FetchRequest r;
      if (!queue_->try_pop(r)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      std::optional<int> fail;
      {
        std::lock_guard<std::mutex> lock(mu_);
        seen_.push_back(Seen{r.op, r.offset, r.length, r.if_match});
        if (r.op == FetchOp::kRange && fail_offset_ && *fail_offset_ == r.offset) {
          fail = fail_status_;
        }
      }
      if (r.op == FetchOp::kHead) {
        queue_->complete_head(r.id, data_.size(), etag_, etag_.empty() ? "modified" : etag_);
      } else if (fail) {
        queue_->fail(r.id, ErrorKind::kIo, *fail, "injected", false);
      } else {
        queue_->complete_range(r.id, reinterpret_cast<const uint8_t*>(data_.data()) + r.offset,
                               r.length);
      }
    }
  }

  std::shared_ptr<FetchQueue> queue_;
  const std::string data_;
  const std::string etag_;
  std::mutex mu_;
  std::vector<Seen> seen_;
  std::optional<uint64_t> fail_offset_;
  int fail_status_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace chute::test

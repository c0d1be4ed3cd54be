// The queue between remote byte sources and the threads that talk to object
// stores. Native threads never call Python, and the object-store client is a
// Python package, so the sources only describe what they need (a HEAD, or a
// byte range of an object) and a fetcher outside the core (chute.remote's
// executor) takes requests, performs them and hands the bytes back:
//
//   source  --submit-->  FetchQueue  --try_pop-->  fetcher
//   source  <--on_range/on_head/on_failure--  complete/fail  <--  fetcher
//
// The queue owns the retry policy (a failure the fetcher marks retryable
// comes back after an exponential backoff with jitter, up to `retries`
// times), the byte budget shared by every source of the process
// (`prefetch_bytes`), and the bounds on waiting: a request in flight for
// longer than its timeout is failed as a retryable timeout even when the
// fetcher never answers. close() fails everything queued or in flight and
// wakes the fetcher, which exits.
//
// A fetcher sleeps on wake_fd() (an eventfd: readable when a request became
// ready, a request's target was cancelled, or the queue closed); take_cancelled()
// names the in-flight requests whose source went away, so that the fetcher
// can abort them rather than finish them for nobody.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "io/unique_fd.h"

namespace chute {

struct FetchSettings {
  uint64_t range_bytes = uint64_t{8} << 20;  // bytes per ranged GET
  int max_in_flight = 4;                     // ranges requested ahead, per object
  uint64_t prefetch_bytes = uint64_t{256} << 20;  // fetched but unconsumed bytes, per queue
  int retries = 5;                           // further attempts after a retryable failure
  double backoff_s = 0.25;                   // first retry delay (before jitter)
  double max_backoff_s = 8.0;
  double timeout_s = 60.0;                   // one attempt, from pop to answer
};

enum class FetchOp { kHead, kRange };

struct FetchFailure {
  ErrorKind kind = ErrorKind::kIo;
  int status = 0;  // HTTP status; 0 when there was none (connection error, timeout)
  std::string message;
  int attempts = 0;
};

// What a reader of `url` (an object of `size` bytes) raises for a request
// that failed: the url, the byte range of a range request, the HTTP status
// and, after retries, how many attempts were made.
std::string fetch_failure_message(const std::string& url, FetchOp op, uint64_t offset,
                                  uint64_t length, uint64_t size, const FetchFailure& failure);

// The receiving side of requests: a remote source's state. Called on a
// fetcher thread (or on the thread that closes the queue), never with the
// queue's lock held, at most once per request.
class FetchTarget {
 public:
  virtual ~FetchTarget() = default;
  // `etag` is empty when the store gave none; `version` identifies the
  // object's content for the cache (the ETag, else the modification time).
  virtual void on_head(uint64_t size, const std::string& etag, const std::string& version) = 0;
  virtual void on_range(uint64_t offset, std::vector<uint8_t>&& data) = 0;
  virtual void on_failure(FetchOp op, uint64_t offset, uint64_t length,
                          const FetchFailure& failure) = 0;
};

struct FetchRequest {
  uint64_t id = 0;
  FetchOp op = FetchOp::kRange;
  std::string url;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string if_match;  // ETag the object must still have; empty: any
  // Asked for by a reader that reads the object in order (a source), not at
  // random: a server that ignores Range can serve it from one whole body.
  bool sequential = false;
  int attempt = 0;       // 0 on the first try
  std::weak_ptr<FetchTarget> target;
  // Identity only, for cancel_target: locking `target` under the queue's
  // lock could run the target's destructor there.
  const FetchTarget* owner = nullptr;
};

struct FetchStats {
  uint64_t requests = 0;  // attempts handed to the fetcher
  uint64_t retries = 0;
  uint64_t failures = 0;  // requests that failed for good
  uint64_t bytes = 0;     // range bytes delivered
  uint64_t cache_corrupt_refetches = 0;  // cache entries that failed their checksum
  uint64_t queued = 0;
  uint64_t in_flight = 0;
  uint64_t reserved_bytes = 0;
};

class FetchQueue {
 public:
  explicit FetchQueue(const FetchSettings& settings);
  ~FetchQueue();
  FetchQueue(const FetchQueue&) = delete;
  FetchQueue& operator=(const FetchQueue&) = delete;

  const FetchSettings& settings() const { return settings_; }

  // --- the sources' side ---
  // Queues a request; returns false (and queues nothing) once closed.
  bool submit(FetchOp op, const std::string& url, uint64_t offset, uint64_t length,
              const std::string& if_match, const std::shared_ptr<FetchTarget>& target,
              bool sequential = false);
  // Drops the target's queued requests and marks its in-flight ones for the
  // fetcher to abort; their answers are ignored.
  void cancel_target(const FetchTarget* target);
  // The shared budget of fetched-but-unconsumed bytes. `force` reserves even
  // past the limit: a source with nothing outstanding must always be able to
  // make progress, or two sources could starve each other.
  bool try_reserve(uint64_t bytes, bool force);
  void release(uint64_t bytes);
  // A source found its cache entry corrupt and fetches the object again.
  void count_corrupt_cache_entry();
  // Fails requests in flight past their deadline (timeout_s plus a grace
  // second) as retryable timeouts. Called by try_pop and by waiting readers,
  // so a fetcher that never answers cannot stall a reader forever.
  void expire_overdue();

  // --- the fetcher's side ---
  // The next ready request (a copy), now counted as in flight; false if none is ready.
  bool try_pop(FetchRequest& out);
  // Seconds until the earliest delayed retry is due; negative when none is.
  double next_delay_s();
  std::vector<uint64_t> take_cancelled();
  int wake_fd() const { return wake_.get(); }
  void consume_wake();
  // Answers for a popped request (ignored when it was cancelled, expired or
  // answered already). A range shorter than requested counts as a retryable
  // failure: a cut response is never delivered as data.
  void complete_range(uint64_t id, const uint8_t* data, size_t n);
  void complete_head(uint64_t id, uint64_t size, const std::string& etag,
                     const std::string& version);
  void fail(uint64_t id, ErrorKind kind, int status, const std::string& message, bool retryable);

  void close();
  bool closed() const;
  FetchStats stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct InFlight {
    std::shared_ptr<FetchRequest> request;
    Clock::time_point deadline;
  };

  void deliver_failure(const std::shared_ptr<FetchRequest>& request, const FetchFailure& failure);
  Clock::duration backoff_locked(int attempt);
  void wake_locked();

  const FetchSettings settings_;
  mutable std::mutex mu_;
  std::deque<std::shared_ptr<FetchRequest>> ready_;
  std::multimap<Clock::time_point, std::shared_ptr<FetchRequest>> delayed_;
  std::unordered_map<uint64_t, InFlight> in_flight_;
  std::vector<uint64_t> cancelled_;
  uint64_t next_id_ = 1;
  uint64_t reserved_ = 0;
  bool closed_ = false;
  std::mt19937_64 rng_;
  FetchStats stats_;
  UniqueFd wake_;
};

}  // namespace chute

#include "io/remote_ranges.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/read_cancel.h"
#include "io/byte_source.h"
#include "io/fetch_queue.h"

namespace chute {

// The answers to one read (or to the HEAD): fetched ranges are copied into
// the spans that asked for them, under the lock, and never after the reader
// stopped waiting (its buffers may be gone by then).
class RemoteRanges::Waiter final : public FetchTarget {
 public:
  struct Piece {
    uint64_t length = 0;
    size_t first_span = 0;  // the sorted spans this range covers: [first_span, end_span)
    size_t end_span = 0;
  };

  Waiter(const std::string& url, uint64_t size, const std::vector<Span>* spans)
      : url_(url), size_(size), spans_(spans) {}

  void add_piece(uint64_t offset, const Piece& piece) { pieces_.emplace(offset, piece); }
  const std::map<uint64_t, Piece>& pieces() const { return pieces_; }

  void on_head(uint64_t size, const std::string& etag, const std::string& version) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (abandoned_) return;
    head_size_ = size;
    head_etag_ = etag;
    head_version_ = version;
    ++answers_;
    progress_ = Clock::now();
    cv_.notify_all();
  }

  void on_range(uint64_t offset, std::vector<uint8_t>&& data) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (abandoned_ || failed_) return;
    auto it = pieces_.find(offset);
    if (it == pieces_.end() || it->second.length != data.size()) return;
    const uint64_t end = offset + data.size();
    for (size_t i = it->second.first_span; i < it->second.end_span; ++i) {
      const Span& s = (*spans_)[i];
      const uint64_t from = std::max(offset, s.offset);
      const uint64_t to = std::min(end, s.offset + s.size);
      if (from >= to) continue;
      std::memcpy(s.dst + (from - s.offset), data.data() + (from - offset),
                  static_cast<size_t>(to - from));
    }
    ++answers_;
    progress_ = Clock::now();
    cv_.notify_all();
  }

  void on_failure(FetchOp op, uint64_t offset, uint64_t length,
                  const FetchFailure& failure) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (abandoned_ || failed_) return;
    failed_ = true;
    error_kind_ = failure.kind;
    error_ = fetch_failure_message(url_, op, offset, length, size_, failure);
    cv_.notify_all();
  }

  // Waits until `expected` answers came, or throws. Afterwards (either way)
  // no answer touches the spans any more.
  void wait(size_t expected, FetchQueue& queue, const std::atomic<bool>* cancel) {
    const FetchSettings& s = queue.settings();
    // As a remote source's: every attempt of one request timing out, with
    // the longest backoff between them.
    const auto backstop = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>((s.timeout_s + 1.0 + s.max_backoff_s) * (s.retries + 1) + 1.0));
    // The engine this thread reads for, if any (core/read_cancel.h).
    const std::atomic<bool>* engine = current_read_cancel();
    std::unique_lock<std::mutex> lock(mu_);
    progress_ = Clock::now();
    try {
      while (answers_ < expected) {
        if (failed_) raise_error(error_kind_, error_, __FILE__, __LINE__);
        CHUTE_CHECK(cancel == nullptr || !cancel->load(std::memory_order_relaxed), kIo,
                    "reading '" << url_ << "' was stopped: its reader was closed");
        CHUTE_CHECK(engine == nullptr || !engine->load(std::memory_order_relaxed), kIo,
                    "reading '" << url_ << "' was stopped: the engine it read for was closed");
        const auto idle = Clock::now() - progress_;
        CHUTE_CHECK(idle <= backstop, kTimeout,
                    "reading '" << url_ << "' timed out: nothing arrived for "
                                << std::chrono::duration<double>(idle).count() << " s");
        cv_.wait_for(lock, std::chrono::milliseconds(kCancelPollMs));
        // Outside our lock: the queue may call back into a target (ours included).
        lock.unlock();
        queue.expire_overdue();
        lock.lock();
      }
      if (failed_) raise_error(error_kind_, error_, __FILE__, __LINE__);
    } catch (...) {
      if (!lock.owns_lock()) lock.lock();
      abandoned_ = true;
      throw;
    }
    abandoned_ = true;
  }

  // No answer touches the spans after this returns (one being copied is
  // finished first: it holds the lock).
  void abandon() {
    std::lock_guard<std::mutex> lock(mu_);
    abandoned_ = true;
  }

  uint64_t head_size() const { return head_size_; }
  const std::string& head_etag() const { return head_etag_; }
  const std::string& head_version() const { return head_version_; }

 private:
  using Clock = std::chrono::steady_clock;

  const std::string url_;
  const uint64_t size_;
  const std::vector<Span>* spans_;  // sorted by offset; owned by the reader
  std::map<uint64_t, Piece> pieces_;  // filled before any request is submitted

  std::mutex mu_;
  std::condition_variable cv_;
  size_t answers_ = 0;
  bool abandoned_ = false;
  bool failed_ = false;
  ErrorKind error_kind_ = ErrorKind::kIo;
  std::string error_;
  Clock::time_point progress_ = Clock::now();
  uint64_t head_size_ = 0;
  std::string head_etag_;
  std::string head_version_;
};

RemoteRanges::RemoteRanges(std::string url, std::shared_ptr<FetchQueue> queue,
                           const std::atomic<bool>* cancel)
    : url_(std::move(url)), queue_(std::move(queue)), cancel_(cancel) {
  CHUTE_CHECK(queue_ != nullptr, kUsage, "no remote reader for '" << url_ << "'");
  auto head = std::make_shared<Waiter>(url_, 0, nullptr);
  CHUTE_CHECK(queue_->submit(FetchOp::kHead, url_, 0, 0, "", head), kIo,
              "cannot read '" << url_ << "': the remote reader was closed");
  try {
    head->wait(1, *queue_, cancel_);
  } catch (...) {
    queue_->cancel_target(head.get());
    throw;
  }
  size_ = head->head_size();
  // A weak ETag never matches If-Match (a strong comparison): it versions
  // the object but cannot guard its ranges.
  if (head->head_etag().rfind("W/", 0) != 0) etag_ = head->head_etag();
  version_ = head->head_version();
}

RemoteRanges::~RemoteRanges() = default;

void RemoteRanges::read(const Span* spans, size_t n) const {
  std::vector<Span> sorted;
  sorted.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (spans[i].size == 0) continue;
    CHUTE_CHECK(spans[i].offset <= size_ && spans[i].size <= size_ - spans[i].offset, kData,
                "'" << url_ << "' ends at byte " << size_ << ", before the end of bytes ["
                    << spans[i].offset << ", " << spans[i].offset + spans[i].size
                    << ") that were asked for");
    sorted.push_back(spans[i]);
  }
  if (sorted.empty()) return;
  std::sort(sorted.begin(), sorted.end(),
            [](const Span& a, const Span& b) { return a.offset < b.offset; });

  auto waiter = std::make_shared<Waiter>(url_, size_, &sorted);
  const uint64_t range_bytes = std::max<uint64_t>(1, queue_->settings().range_bytes);
  size_t i = 0;
  while (i < sorted.size()) {
    // A group of spans that one stretch of the object covers.
    const size_t first = i;
    const uint64_t begin = sorted[i].offset;
    uint64_t end = begin + sorted[i].size;
    ++i;
    while (i < sorted.size() && sorted[i].offset <= end + kCoalesceGap) {
      end = std::max(end, sorted[i].offset + sorted[i].size);
      ++i;
    }
    for (uint64_t at = begin; at < end; at += range_bytes) {
      waiter->add_piece(at, Waiter::Piece{std::min(range_bytes, end - at), first, i});
    }
  }
  size_t submitted = 0;
  try {
    for (const auto& [offset, piece] : waiter->pieces()) {
      CHUTE_CHECK(queue_->submit(FetchOp::kRange, url_, offset, piece.length, etag_, waiter), kIo,
                  "cannot read '" << url_ << "': the remote reader was closed");
      ++submitted;
    }
    waiter->wait(submitted, *queue_, cancel_);
  } catch (...) {
    // A submit that failed leaves earlier ranges in flight: their answers
    // must not land in buffers the caller is about to free.
    waiter->abandon();
    queue_->cancel_target(waiter.get());
    throw;
  }
  uint64_t bytes = 0;
  for (const auto& [offset, piece] : waiter->pieces()) bytes += piece.length;
  ranges_.fetch_add(submitted, std::memory_order_relaxed);
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

namespace {

class RemoteRangeReader final : public RangeReader {
 public:
  RemoteRangeReader(const std::string& url, std::shared_ptr<FetchQueue> queue,
                    const ShardIdentity& expected)
      : ranges_(url, std::move(queue)) {
    CHUTE_CHECK(expected.size < 0 || static_cast<uint64_t>(expected.size) == ranges_.size(), kData,
                "shard '" << url << "' changed after it was indexed (" << ranges_.size()
                          << " bytes, indexed with " << expected.size
                          << "): its index no longer describes it; rebuild the index");
    CHUTE_CHECK(expected.version.empty() || expected.version == ranges_.version(), kData,
                "shard '" << url << "' changed after it was indexed (version "
                          << ranges_.version() << ", indexed with " << expected.version
                          << "): its index no longer describes it; rebuild the index");
  }
  void read(uint64_t offset, size_t size, uint8_t* dst) const override {
    ranges_.read(offset, size, dst);
  }
  void read_spans(const Span* spans, size_t n) const override {
    std::vector<RemoteRanges::Span> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = {spans[i].offset, spans[i].size, spans[i].dst};
    ranges_.read(all.data(), all.size());
  }
  const std::string& url() const override { return ranges_.url(); }

 private:
  RemoteRanges ranges_;
};

}  // namespace

std::unique_ptr<RangeReader> open_remote_range_reader(const std::string& url,
                                                      std::shared_ptr<FetchQueue> queue,
                                                      const ShardIdentity& expected) {
  return std::make_unique<RemoteRangeReader>(url, std::move(queue), expected);
}

}  // namespace chute

#include "io/fetch_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

namespace chute {
namespace {

// An attempt the fetcher has not answered this long after its own timeout is
// treated as lost (the fetcher's client normally times out first).
constexpr double kOverdueGraceS = 1.0;

}  // namespace

FetchQueue::FetchQueue(const FetchSettings& settings)
    : settings_(settings), rng_(std::random_device{}()) {
  CHUTE_CHECK(settings_.range_bytes > 0, kUsage, "range_bytes must be positive");
  CHUTE_CHECK(settings_.max_in_flight > 0, kUsage, "max_in_flight must be positive");
  CHUTE_CHECK(settings_.retries >= 0, kUsage, "retries must not be negative");
  CHUTE_CHECK(settings_.timeout_s > 0, kUsage, "timeout_s must be positive");
  CHUTE_CHECK(settings_.backoff_s >= 0 && settings_.max_backoff_s >= 0, kUsage,
              "backoff times must not be negative");
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const int err = errno;
  CHUTE_CHECK(fd >= 0, kIo, "cannot create the fetch queue's eventfd" << OsFailure(err));
  wake_.reset(fd);
}

FetchQueue::~FetchQueue() { close(); }

std::string fetch_failure_message(const std::string& url, FetchOp op, uint64_t offset,
                                  uint64_t length, uint64_t size, const FetchFailure& failure) {
  std::ostringstream os;
  os << "cannot read '" << url << "'";
  if (op == FetchOp::kRange) {
    os << " (bytes " << offset << "-" << offset + length - 1 << " of " << size << ")";
  }
  os << ": ";
  if (failure.status != 0) os << "HTTP " << failure.status << ": ";
  os << failure.message;
  if (failure.attempts > 1) os << " (gave up after " << failure.attempts << " attempts)";
  return os.str();
}

void FetchQueue::wake_locked() {
  const uint64_t one = 1;
  // A full counter (never in practice) is still readable, which is all a wake needs.
  (void)!::write(wake_.get(), &one, sizeof one);
}

void FetchQueue::consume_wake() {
  uint64_t value;
  (void)!::read(wake_.get(), &value, sizeof value);
}

bool FetchQueue::submit(FetchOp op, const std::string& url, uint64_t offset, uint64_t length,
                        const std::string& if_match, const std::shared_ptr<FetchTarget>& target,
                        bool sequential) {
  auto request = std::make_shared<FetchRequest>();
  request->op = op;
  request->url = url;
  request->offset = offset;
  request->length = length;
  request->if_match = if_match;
  request->sequential = sequential;
  request->target = target;
  request->owner = target.get();
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  request->id = next_id_++;
  ready_.push_back(std::move(request));
  wake_locked();
  return true;
}

void FetchQueue::cancel_target(const FetchTarget* target) {
  std::lock_guard<std::mutex> lock(mu_);
  ready_.erase(std::remove_if(ready_.begin(), ready_.end(),
                              [&](const auto& r) { return r->owner == target; }),
               ready_.end());
  for (auto it = delayed_.begin(); it != delayed_.end();) {
    it = it->second->owner == target ? delayed_.erase(it) : std::next(it);
  }
  bool any = false;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (it->second.request->owner == target) {
      cancelled_.push_back(it->first);
      it = in_flight_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  if (any) wake_locked();
}

bool FetchQueue::try_reserve(uint64_t bytes, bool force) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!force && reserved_ + bytes > settings_.prefetch_bytes) return false;
  reserved_ += bytes;
  return true;
}

void FetchQueue::release(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= std::min(reserved_, bytes);
}

void FetchQueue::count_corrupt_cache_entry() {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.cache_corrupt_refetches;
}

void FetchQueue::expire_overdue() {
  std::vector<uint64_t> overdue;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = Clock::now();
    for (const auto& [id, entry] : in_flight_) {
      if (entry.deadline <= now) overdue.push_back(id);
    }
    if (overdue.empty()) return;
    // The fetcher may still be working on them: ask it to stop.
    cancelled_.insert(cancelled_.end(), overdue.begin(), overdue.end());
    wake_locked();
  }
  std::ostringstream why;
  why << "no answer within " << settings_.timeout_s << " s";
  for (uint64_t id : overdue) fail(id, ErrorKind::kIo, 0, why.str(), true);
}

bool FetchQueue::try_pop(FetchRequest& out) {
  expire_overdue();
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  const Clock::time_point now = Clock::now();
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    ready_.push_back(std::move(delayed_.begin()->second));
    delayed_.erase(delayed_.begin());
  }
  while (!ready_.empty()) {
    std::shared_ptr<FetchRequest> request = std::move(ready_.front());
    ready_.pop_front();
    if (request->target.expired()) continue;  // its source is gone
    const auto deadline =
        now + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(settings_.timeout_s + kOverdueGraceS));
    out = *request;
    const uint64_t id = request->id;
    in_flight_.emplace(id, InFlight{std::move(request), deadline});
    ++stats_.requests;
    return true;
  }
  return false;
}

double FetchQueue::next_delay_s() {
  std::lock_guard<std::mutex> lock(mu_);
  if (delayed_.empty()) return -1.0;
  const double s = std::chrono::duration<double>(delayed_.begin()->first - Clock::now()).count();
  return std::max(0.0, s);
}

std::vector<uint64_t> FetchQueue::take_cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> out;
  out.swap(cancelled_);
  return out;
}

FetchQueue::Clock::duration FetchQueue::backoff_locked(int attempt) {
  const double base = settings_.backoff_s * std::pow(2.0, std::max(0, attempt - 1));
  const double capped = std::min(settings_.max_backoff_s, base);
  // Half fixed, half random: spreads the retries of many readers that failed
  // together (a restarted server) without ever retrying immediately.
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(capped * jitter(rng_)));
}

void FetchQueue::complete_range(uint64_t id, const uint8_t* data, size_t n) {
  FetchRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_flight_.find(id);
    if (it == in_flight_.end()) return;
    request = *it->second.request;
    if (request.op != FetchOp::kRange) return;
  }
  if (n != request.length) {
    std::ostringstream why;
    why << (n < request.length ? "short response: " : "response too long: ") << n << " bytes for a range of "
        << request.length;
    fail(id, ErrorKind::kIo, 0, why.str(), true);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_.erase(id) == 0) return;  // cancelled or expired meanwhile
    stats_.bytes += n;
  }
  std::shared_ptr<FetchTarget> target = request.target.lock();
  if (!target) return;
  std::vector<uint8_t> bytes(n);
  if (n > 0) std::memcpy(bytes.data(), data, n);
  target->on_range(request.offset, std::move(bytes));
}

void FetchQueue::complete_head(uint64_t id, uint64_t size, const std::string& etag,
                               const std::string& version) {
  std::shared_ptr<FetchRequest> request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_flight_.find(id);
    if (it == in_flight_.end() || it->second.request->op != FetchOp::kHead) return;
    request = std::move(it->second.request);
    in_flight_.erase(it);
  }
  if (std::shared_ptr<FetchTarget> target = request->target.lock()) {
    target->on_head(size, etag, version);
  }
}

void FetchQueue::fail(uint64_t id, ErrorKind kind, int status, const std::string& message,
                      bool retryable) {
  std::shared_ptr<FetchRequest> request;
  FetchFailure failure{kind, status, message, 0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_flight_.find(id);
    if (it == in_flight_.end()) return;
    request = std::move(it->second.request);
    in_flight_.erase(it);
    failure.attempts = request->attempt + 1;
    if (retryable && !closed_ && request->attempt < settings_.retries &&
        !request->target.expired()) {
      ++request->attempt;
      // A fresh id: a late answer to the abandoned attempt must not count for the new one.
      request->id = next_id_++;
      ++stats_.retries;
      delayed_.emplace(Clock::now() + backoff_locked(request->attempt), std::move(request));
      wake_locked();  // the fetcher recomputes how long to sleep
      return;
    }
    ++stats_.failures;
  }
  deliver_failure(request, failure);
}

void FetchQueue::deliver_failure(const std::shared_ptr<FetchRequest>& request,
                                 const FetchFailure& failure) {
  if (std::shared_ptr<FetchTarget> target = request->target.lock()) {
    target->on_failure(request->op, request->offset, request->length, failure);
  }
}

void FetchQueue::close() {
  std::vector<std::shared_ptr<FetchRequest>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& r : ready_) dropped.push_back(std::move(r));
    ready_.clear();
    for (auto& [when, r] : delayed_) dropped.push_back(std::move(r));
    delayed_.clear();
    for (auto& [id, entry] : in_flight_) {
      cancelled_.push_back(id);
      dropped.push_back(std::move(entry.request));
    }
    in_flight_.clear();
    wake_locked();
  }
  const FetchFailure failure{ErrorKind::kIo, 0, "the remote reader was closed", 0};
  for (const auto& r : dropped) deliver_failure(r, failure);
}

bool FetchQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

FetchStats FetchQueue::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  FetchStats s = stats_;
  s.queued = ready_.size() + delayed_.size();
  s.in_flight = in_flight_.size();
  s.reserved_bytes = reserved_;
  return s;
}

}  // namespace chute

#include "io/remote_source.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "io/crc32c.h"
#include "io/fetch_queue.h"
#include "io/object_cache.h"
#include "io/sources.h"
#include "io/unique_fd.h"

namespace chute {
namespace {

using Clock = std::chrono::steady_clock;

// How a source gets its bytes; decided when the HEAD is back.
enum class Mode {
  kHead,      // waiting for the HEAD
  kStream,    // ranges held in memory until read (after an optional file prefix)
  kHit,       // the cached entry, read as a local file
  kDownload,  // ranges written in order to our part file, read from there
  kFollow,    // another process's part file, read as it grows
};

uint64_t file_size(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

bool write_all_at(int fd, const uint8_t* p, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return true;
}

struct CacheConfig {
  std::string dir;  // empty: no cache
  uint64_t limit = 0;
  bool fsync = true;
  size_t readahead = 0;
  std::shared_ptr<SourceCounters> counters;  // null: not counted
};

class RemoteObject final : public FetchTarget, public std::enable_shared_from_this<RemoteObject> {
 public:
  RemoteObject(std::string url, std::shared_ptr<FetchQueue> queue, CacheConfig cache)
      : url_(std::move(url)),
        queue_(std::move(queue)),
        settings_(queue_->settings()),
        cache_(std::move(cache)),
        progress_(Clock::now()) {
    if (!cache_.dir.empty()) entry_ = cache_.dir + "/" + cache_file_name(url_);
    // The longest a reader may wait with nothing arriving: every attempt of
    // one request timing out, with the longest backoff between them.
    backstop_ = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
        (settings_.timeout_s + 1.0 + settings_.max_backoff_s) * (settings_.retries + 1) + 1.0));
  }

  ~RemoteObject() override = default;
  RemoteObject(const RemoteObject&) = delete;
  RemoteObject& operator=(const RemoteObject&) = delete;

  const std::string& url() const { return url_; }

  void start() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!queue_->submit(FetchOp::kHead, url_, 0, 0, "", shared_from_this())) {
      fail_locked(ErrorKind::kIo, "cannot read '" + url_ + "': the remote reader was closed");
    }
  }

  // --- fetcher side ---

  void on_head(uint64_t size, const std::string& etag, const std::string& version) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || mode_ != Mode::kHead) return;
    size_ = size;
    // A weak ETag (W/"...") never matches If-Match (a strong comparison), so
    // it cannot guard the ranges; it still identifies the version for the cache.
    if (etag.rfind("W/", 0) != 0) etag_ = etag;
    version_ = version;
    progress_ = Clock::now();
    if (entry_.empty()) {
      mode_ = Mode::kStream;
    } else {
      choose_cache_mode_locked();
    }
    if (mode_ == Mode::kStream || mode_ == Mode::kDownload) issue_locked();
    cv_.notify_all();
  }

  void on_range(uint64_t offset, std::vector<uint8_t>&& data) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    auto it = chunks_.find(offset);
    if (it == chunks_.end() || it->second.arrived) return;
    it->second.data = std::move(data);
    it->second.arrived = true;
    progress_ = Clock::now();
    if (mode_ == Mode::kDownload) write_ready_locked();
    cv_.notify_all();
  }

  void on_failure(FetchOp op, uint64_t offset, uint64_t length,
                  const FetchFailure& failure) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    const std::string message = fetch_failure_message(url_, op, offset, length, size_, failure);
    if (op == FetchOp::kHead) {
      fail_locked(failure.kind, message);
    } else {
      // The bytes before this range are still good: the reader gets them,
      // then this error where the range begins.
      auto it = chunks_.find(offset);
      if (it != chunks_.end()) {
        it->second.failed = true;
        it->second.kind = failure.kind;
        it->second.error = message;
      }
      range_failed_ = true;  // nothing past it will be read: request no more
      if (mode_ == Mode::kDownload) abandon_download_locked();
    }
    cv_.notify_all();
  }

  // --- reader side ---

  size_t read(uint64_t& pos, uint8_t* dst, size_t n, const std::atomic<bool>* cancel) {
    const Clock::time_point since = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      throw_if_failed_locked();
      if (mode_ == Mode::kHit && hit_ == nullptr && !check_hit_locked(cancel)) continue;
      if (mode_ == Mode::kHit) {
        ByteSource* hit = hit_.get();
        lock.unlock();
        const size_t got = hit->read(dst, n);
        pos += got;
        return got;
      }
      if (mode_ != Mode::kHead) {
        if (pos >= size_) {
          if (mode_ == Mode::kDownload) publish_locked();
          return 0;
        }
        if (mode_ == Mode::kFollow) follow_locked();
        if (pos < file_end_) {
          const int fd = file_.get();
          const size_t want = static_cast<size_t>(std::min<uint64_t>(n, file_end_ - pos));
          lock.unlock();
          return read_file(fd, pos, dst, want);
        }
        if (mode_ == Mode::kStream && !chunks_.empty()) {
          auto it = chunks_.begin();
          Chunk& c = it->second;
          if (c.failed) throw_chunk(c);
          if (c.arrived) return copy_chunk_locked(it, pos, dst, n);
        }
      }
      wait_locked(lock, cancel, since);
    }
  }

  std::shared_ptr<MappedFile> map_file(const std::atomic<bool>* cancel) {
    const Clock::time_point since = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (mode_ == Mode::kHead && !failed_) wait_locked(lock, cancel, since);
    if (mode_ == Mode::kHit && hit_ == nullptr) check_hit_locked(cancel);
    if (mode_ != Mode::kHit) return nullptr;
    ByteSource* hit = hit_.get();
    lock.unlock();
    return hit->map_file();
  }

  void will_read(uint64_t offset) {
    ByteSource* hit = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (mode_ == Mode::kHit) hit = hit_.get();
    }
    if (hit != nullptr) hit->will_read(offset);
  }

  // The source is done with the object: a finished download is published,
  // anything else is dropped, and the queue forgets our requests.
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      if (mode_ == Mode::kDownload) {
        if (file_end_ == size_) {
          publish_locked();
        } else {
          abandon_download_locked();
        }
      }
      closed_ = true;
      queue_->release(reserved_);
      reserved_ = 0;
      chunks_.clear();
      cv_.notify_all();
    }
    queue_->cancel_target(this);
  }

 private:
  struct Chunk {
    uint64_t length = 0;
    std::vector<uint8_t> data;
    bool arrived = false;
    bool failed = false;
    ErrorKind kind = ErrorKind::kIo;
    std::string error;
  };

  [[noreturn]] static void throw_chunk(const Chunk& c) {
    raise_error(c.kind, c.error, __FILE__, __LINE__);
  }

  void fail_locked(ErrorKind kind, const std::string& message) {
    if (failed_) return;
    failed_ = true;
    error_kind_ = kind;
    error_ = message;
    if (mode_ == Mode::kDownload) abandon_download_locked();
    cv_.notify_all();
  }

  void throw_if_failed_locked() const {
    if (failed_) raise_error(error_kind_, error_, __FILE__, __LINE__);
  }

  // One bounded slice of waiting. `since` is when the caller began to wait:
  // a reader that consumed nothing for a while has no request to blame.
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::atomic<bool>* cancel,
                   Clock::time_point since) {
    throw_if_failed_locked();
    CHUTE_CHECK(cancel == nullptr || !cancel->load(std::memory_order_relaxed), kIo,
                "reading '" << url_ << "' was stopped: its reader was closed");
    CHUTE_CHECK(!closed_, kIo, "reading '" << url_ << "' was stopped: the source was closed");
    const auto idle = Clock::now() - std::max(progress_, since);
    if (idle > backstop_) {
      if (mode_ == Mode::kFollow) {
        // The other process is alive but makes no progress: fetch the rest ourselves.
        stream_rest_locked();
        return;
      }
      std::ostringstream os;
      os << "reading '" << url_ << "' timed out: nothing arrived for "
         << std::chrono::duration<double>(idle).count() << " s";
      fail_locked(ErrorKind::kTimeout, os.str());
      throw_if_failed_locked();
    }
    cv_.wait_for(lock, std::chrono::milliseconds(kCancelPollMs));
    // Outside our lock: the queue may call back into a target (ours included).
    lock.unlock();
    queue_->expire_overdue();
    lock.lock();
  }

  size_t read_file(int fd, uint64_t& pos, uint8_t* dst, size_t n) {
    for (;;) {
      const ssize_t r = ::pread(fd, dst, n, static_cast<off_t>(pos));
      if (r > 0) {
        pos += static_cast<uint64_t>(r);
        return static_cast<size_t>(r);
      }
      const int err = errno;
      if (r < 0 && err == EINTR) continue;
      CHUTE_CHECK(r < 0, kIo, "cannot read the cached copy of '"
                                  << url_ << "' at offset " << pos
                                  << ": the file is shorter than expected");
      // (The copy is its entry or its part file, which may be renamed meanwhile: no path.)
      CHUTE_CHECK(false, kIo, "cannot read the cached copy of '" << url_ << "' at offset " << pos
                                                                << OsFailure(err));
    }
  }

  size_t copy_chunk_locked(std::map<uint64_t, Chunk>::iterator it, uint64_t& pos, uint8_t* dst,
                           size_t n) {
    Chunk& c = it->second;
    const uint64_t begin = it->first;
    const uint64_t within = pos - begin;
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n, c.length - within));
    std::copy_n(c.data.data() + within, k, dst);
    pos += k;
    if (pos == begin + c.length) {
      retire_locked(it);
      issue_locked();
    }
    return k;
  }

  void retire_locked(std::map<uint64_t, Chunk>::iterator it) {
    const uint64_t length = it->second.length;
    chunks_.erase(it);
    queue_->release(length);
    reserved_ -= length;
    --outstanding_;
  }

  void issue_locked() {
    while (outstanding_ < settings_.max_in_flight && issue_from_ < size_ && !failed_ &&
           !range_failed_) {
      const uint64_t length = std::min<uint64_t>(settings_.range_bytes, size_ - issue_from_);
      if (!queue_->try_reserve(length, outstanding_ == 0)) return;
      if (!queue_->submit(FetchOp::kRange, url_, issue_from_, length, etag_, shared_from_this(),
                          /*sequential=*/true)) {
        queue_->release(length);
        fail_locked(ErrorKind::kIo, "cannot read '" + url_ + "': the remote reader was closed");
        return;
      }
      chunks_.emplace(issue_from_, Chunk{length, {}, false, false, ErrorKind::kIo, {}});
      reserved_ += length;
      ++outstanding_;
      issue_from_ += length;
    }
  }

  // --- the cache ---

  cache::ObjectVersion version() const { return cache::ObjectVersion{size_, version_}; }

  // Our cached copy if it is present, complete and of the version the HEAD
  // gave. Its bytes are checked against its checksum by the reader
  // (check_hit_locked), not here: this runs on the fetcher's thread.
  bool try_hit_locked() {
    UniqueFd fd = cache::open_entry(entry_);
    if (!fd.valid()) return false;
    cache::EntryMeta have;
    if (!cache::read_meta(entry_, have) || !(have.version == version()) ||
        file_size(fd.get()) != size_) {
      return false;
    }
    hit_fd_ = std::move(fd);
    hit_crc32c_ = have.crc32c;
    mode_ = Mode::kHit;
    return true;
  }

  // Before the first byte of a cache hit is served: the whole entry against
  // the checksum made while it was downloaded. A mismatch (a disk error, a
  // stray write) drops the entry and fetches the object again, as a miss
  // would. Returns whether the hit stands.
  bool check_hit_locked(const std::atomic<bool>* cancel) {
    if (cache::verify_entry(hit_fd_.get(), size_, hit_crc32c_, cancel)) {
      hit_ = open_file_source_fd(url_, entry_, std::move(hit_fd_), cache_.readahead);
      return true;
    }
    CHUTE_CHECK(cancel == nullptr || !cancel->load(std::memory_order_relaxed), kIo,
                "reading '" << url_ << "' was stopped: its reader was closed");
    cache::drop_entry(entry_, hit_fd_.get());
    hit_fd_.reset();
    queue_->count_corrupt_cache_entry();
    if (cache_.counters) cache_.counters->cache_corrupt_refetches.fetch_add(1);
    mode_ = Mode::kHead;
    choose_cache_mode_locked(/*allow_hit=*/false);
    progress_ = Clock::now();
    if (mode_ == Mode::kStream || mode_ == Mode::kDownload) issue_locked();
    return false;
  }

  // `allow_hit` false: the entry was just found corrupt; whatever is under
  // its name now is not taken (a download of our own replaces it).
  void choose_cache_mode_locked(bool allow_hit = true) {
    if (allow_hit && try_hit_locked()) return;
    if (lock_.try_acquire(entry_)) {
      // Someone may have published it between our look and our lock.
      if ((allow_hit && try_hit_locked()) || !start_download_locked()) lock_.release();
      if (mode_ == Mode::kHead) mode_ = Mode::kStream;
      return;
    }
    cache::ObjectVersion noted;
    if (watch_.open(entry_) && watch_.read_note(noted) && noted == version()) {
      UniqueFd part(open_cloexec(entry_ + "+part", O_RDONLY));
      if (part.valid() && ::flock(part.get(), LOCK_SH) == 0) {
        file_ = std::move(part);
        file_end_ = std::min(size_, file_size(file_.get()));
        mode_ = Mode::kFollow;
        return;
      }
    }
    // The other download finished (or gave up) between our look and our lock?
    if (allow_hit && try_hit_locked()) return;
    mode_ = Mode::kStream;
  }

  bool start_download_locked() {
    if (!cache::make_room(cache_.dir, cache_.limit, size_)) return false;
    part_path_ = entry_ + "+part";
    (void)::unlink(part_path_.c_str());  // a dead owner's leftover
    UniqueFd writer(open_cloexec(part_path_, O_WRONLY | O_CREAT | O_EXCL, 0666));
    if (!writer.valid()) return false;
    UniqueFd reader(open_cloexec(part_path_, O_RDONLY));
    // Our shared lock travels with the file when it is published, so an
    // evictor cannot take the entry while we still read it.
    if (!reader.valid() || ::flock(reader.get(), LOCK_SH) != 0) {
      (void)::unlink(part_path_.c_str());
      return false;
    }
    part_write_ = std::move(writer);
    file_ = std::move(reader);
    file_end_ = 0;
    part_crc32c_ = 0;
    lock_.note(version());
    mode_ = Mode::kDownload;
    return true;
  }

  // Writes the arrived ranges that continue the part file, in order, so
  // that the file's size is always how much of the object is there (what
  // followers in other processes rely on).
  void write_ready_locked() {
    while (!chunks_.empty()) {
      auto it = chunks_.begin();
      if (it->first != file_end_ || !it->second.arrived) return;
      if (!write_all_at(part_write_.get(), it->second.data.data(), it->second.length, file_end_)) {
        // A full disk costs the cache entry, not the read: the rest comes from memory.
        abandon_download_locked();
        return;
      }
      part_crc32c_ = crc32c(part_crc32c_, it->second.data.data(), it->second.length);
      file_end_ += it->second.length;
      retire_locked(it);
    }
    issue_locked();
  }

  void publish_locked() {
    if (mode_ != Mode::kDownload || !part_write_.valid()) return;
    if (cache::publish(part_write_.get(), part_path_, entry_, cache_.fsync)) {
      cache::write_meta(entry_, url_, cache::EntryMeta{version(), part_crc32c_});
    }
    part_write_.reset();
    lock_.release();
  }

  // Stops caching: what is in the part file stays readable through our
  // descriptor, the rest is read into memory. Others see the lock go and
  // fetch for themselves.
  void abandon_download_locked() {
    if (part_write_.valid()) {
      (void)::unlink(part_path_.c_str());
      part_write_.reset();
    }
    lock_.release();
    if (mode_ == Mode::kDownload) mode_ = Mode::kStream;
  }

  // Follower: takes what the owner has written since; if the owner is gone
  // and the file is short, the rest comes from the store.
  void follow_locked() {
    const uint64_t now = std::min(size_, file_size(file_.get()));
    if (now > file_end_) {
      file_end_ = now;
      progress_ = Clock::now();
      return;
    }
    if (file_end_ < size_ && !watch_.owner_alive()) {
      file_end_ = std::min(size_, file_size(file_.get()));  // its last write, if any
      if (file_end_ < size_) stream_rest_locked();
    }
  }

  void stream_rest_locked() {
    mode_ = Mode::kStream;
    issue_from_ = file_end_;
    progress_ = Clock::now();
    issue_locked();
  }

  const std::string url_;
  const std::shared_ptr<FetchQueue> queue_;
  const FetchSettings settings_;
  const CacheConfig cache_;
  std::string entry_;  // the cache entry's path; empty without a cache
  Clock::duration backstop_{};

  std::mutex mu_;
  std::condition_variable cv_;
  Mode mode_ = Mode::kHead;
  bool closed_ = false;
  bool failed_ = false;        // the whole object failed (its HEAD, a closed queue, a stall)
  bool range_failed_ = false;  // one range failed for good; the bytes before it are still read
  ErrorKind error_kind_ = ErrorKind::kIo;
  std::string error_;
  Clock::time_point progress_;  // when anything last arrived

  uint64_t size_ = 0;
  std::string etag_;  // sent as If-Match with every range; empty: none
  std::string version_;

  // Ranges requested and not yet retired (read in kStream, written in kDownload).
  std::map<uint64_t, Chunk> chunks_;
  uint64_t issue_from_ = 0;
  int outstanding_ = 0;
  uint64_t reserved_ = 0;

  // A local file holding the object's first file_end_ bytes (kDownload,
  // kFollow, and kStream after either).
  UniqueFd file_;
  uint64_t file_end_ = 0;
  UniqueFd part_write_;
  std::string part_path_;
  uint32_t part_crc32c_ = 0;  // of the part file's bytes so far
  cache::DownloadLock lock_;
  cache::LockWatch watch_;
  // A cache hit: its entry open (with its shared lock) and the checksum its
  // meta records, until checked; then the entry as a local file source.
  UniqueFd hit_fd_;
  uint32_t hit_crc32c_ = 0;
  std::unique_ptr<ByteSource> hit_;
};

class RemoteSource final : public ByteSource {
 public:
  RemoteSource(std::shared_ptr<RemoteObject> object, const std::atomic<bool>* cancel)
      : object_(std::move(object)), cancel_(cancel) {}
  ~RemoteSource() override { object_->close(); }
  RemoteSource(const RemoteSource&) = delete;
  RemoteSource& operator=(const RemoteSource&) = delete;

  size_t read(uint8_t* dst, size_t n) override {
    if (n == 0) return 0;
    return object_->read(pos_, dst, n, cancel_);
  }
  const std::string& url() const override { return object_->url(); }
  std::shared_ptr<MappedFile> map_file() override { return object_->map_file(cancel_); }
  void will_read(uint64_t offset) override { object_->will_read(offset); }

 private:
  std::shared_ptr<RemoteObject> object_;
  const std::atomic<bool>* cancel_;
  uint64_t pos_ = 0;
};

}  // namespace

const std::vector<RemoteScheme>& remote_schemes() {
  static const std::vector<RemoteScheme> schemes = {
      {"http", {}, "http", "a web server"},
      {"https", {}, "http", "a web server"},
      {"s3", {"s3a"}, "s3", "Amazon S3 and S3-compatible stores (`endpoint`)"},
      {"gs", {}, "gcs", "Google Cloud Storage"},
      {"az", {"azure", "abfs", "abfss", "adl"}, "azure", "Azure Blob Storage and Data Lake"},
      {"hf", {}, "hf", "the Hugging Face Hub"},
  };
  return schemes;
}

std::string remote_scheme_list() {
  std::string list;
  for (const RemoteScheme& scheme : remote_schemes()) {
    list += (list.empty() ? "" : ", ") + scheme.name + "://";
    for (const std::string& alias : scheme.aliases) list += ", " + alias + "://";
  }
  return list;
}

bool is_remote_url(const std::string& url) {
  const size_t colon = url.find("://");
  if (colon == std::string::npos) return false;
  std::string name = url.substr(0, colon);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const RemoteScheme& scheme : remote_schemes()) {
    if (name == scheme.name ||
        std::find(scheme.aliases.begin(), scheme.aliases.end(), name) != scheme.aliases.end()) {
      return true;
    }
  }
  return false;
}

std::unique_ptr<ByteSource> open_remote_source(const std::string& url,
                                               const SourceOptions& options) {
  CHUTE_CHECK(options.remote != nullptr, kUsage, "no remote reader for '" << url << "'");
  CacheConfig cache;
  cache.dir = options.cache_dir;
  cache.limit = options.cache_limit_bytes;
  cache.fsync = options.cache_fsync;
  cache.readahead = options.readahead_bytes;
  cache.counters = options.counters;
  if (!cache.dir.empty()) cache::make_dirs(cache.dir, url);
  auto object = std::make_shared<RemoteObject>(url, options.remote, std::move(cache));
  object->start();
  return std::make_unique<RemoteSource>(std::move(object), options.cancel);
}

}  // namespace chute

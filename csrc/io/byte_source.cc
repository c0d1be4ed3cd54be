#include "io/byte_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cctype>
#include <cstdio>

#include "core/error.h"
#include "io/gzip_source.h"
#include "io/object_cache.h"
#include "io/remote_source.h"
#include "io/sources.h"
#include "io/unique_fd.h"

namespace chute {
namespace {

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// FNV-1a: stable across runs, machines and standard libraries, unlike std::hash.
uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Tees the bytes of a pipe into a temporary file and publishes it only after a
// complete, successful read; a reader that stops early or fails leaves nothing.
class CachingSource final : public ByteSource {
 public:
  CachingSource(std::unique_ptr<ByteSource> inner, std::string cache_dir, std::string final_path,
                uint64_t cache_limit, bool fsync)
      : inner_(std::move(inner)),
        cache_dir_(std::move(cache_dir)),
        final_path_(std::move(final_path)),
        cache_limit_(cache_limit),
        fsync_(fsync) {
    static std::atomic<uint64_t> counter{0};
    tmp_path_ = final_path_ + "+tmp." + std::to_string(::getpid()) + "." +
                std::to_string(counter.fetch_add(1));
    const int fd = open_cloexec(tmp_path_, O_WRONLY | O_CREAT | O_EXCL, 0666);
    const int err = errno;
    CHUTE_CHECK(fd >= 0, kIo, "cannot create cache file '" << tmp_path_ << "' for '" << url()
                                                           << "'" << OsFailure(err, tmp_path_));
    tmp_.reset(fd);
  }

  ~CachingSource() override { abandon(); }

  CachingSource(const CachingSource&) = delete;
  CachingSource& operator=(const CachingSource&) = delete;

  size_t read(uint8_t* dst, size_t n) override {
    const size_t got = inner_->read(dst, n);  // a failing command throws here
    if (got > 0) {
      write_all(dst, got);
    } else {
      at_eof_ = true;
    }
    return got;
  }

  void mark_complete() override {
    if (at_eof_) publish();
  }

  const std::string& url() const override { return inner_->url(); }

 private:
  void write_all(const uint8_t* p, size_t n) {
    while (n > 0 && tmp_.valid()) {
      const ssize_t w = ::write(tmp_.get(), p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        // The cache is an optimisation: a full disk costs the cache entry, not the read.
        abandon();
        return;
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  void publish() {
    if (!tmp_.valid()) return;
    const bool ok = cache::publish(tmp_.get(), tmp_path_, final_path_, fsync_);
    tmp_.reset();
    tmp_path_.clear();
    if (ok) (void)cache::make_room(cache_dir_, cache_limit_, 0);
  }

  void abandon() {
    if (tmp_path_.empty()) return;
    tmp_.reset();
    (void)::unlink(tmp_path_.c_str());
    tmp_path_.clear();
  }

  std::unique_ptr<ByteSource> inner_;
  std::string cache_dir_;
  std::string final_path_;
  uint64_t cache_limit_;
  bool fsync_;
  std::string tmp_path_;
  UniqueFd tmp_;
  bool at_eof_ = false;
};

}  // namespace

std::string cache_file_name(const std::string& url) {
  std::string command = starts_with(url, "pipe:") ? url.substr(5) : url;
  std::string chosen, last;
  size_t i = 0;
  while (i < command.size()) {
    while (i < command.size() && std::isspace(static_cast<unsigned char>(command[i]))) ++i;
    size_t j = i;
    while (j < command.size() && !std::isspace(static_cast<unsigned char>(command[j]))) ++j;
    if (j > i) {
      std::string token = command.substr(i, j - i);
      last = token;
      if (token.find_first_of("/.") != std::string::npos) chosen = token;
    }
    i = j;
  }
  if (chosen.empty()) chosen = last;
  const size_t cut = chosen.find_first_of("?#");
  if (cut != std::string::npos) chosen.resize(cut);
  const size_t slash = chosen.rfind('/');
  if (slash != std::string::npos) chosen.erase(0, slash + 1);
  std::string base;
  for (char c : chosen) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
    base.push_back(keep ? c : '_');
    if (base.size() == 80) break;
  }
  if (base.empty() || base == "." || base == "..") base = "shard";
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a64(url)));
  return std::string(hash) + "-" + base;
}

std::unique_ptr<ByteSource> open_stored_source(const std::string& url,
                                               const SourceOptions& options) {
  if (starts_with(url, "pipe:")) {
    const std::string command = url.substr(5);
    CHUTE_CHECK(command.find_first_not_of(" \t\n") != std::string::npos, kUsage,
                "empty pipe command in url '" << url << "'");
    if (options.cache_dir.empty()) {
      return open_pipe_source(url, command, options.pipe_timeout_s, options.cancel);
    }
    const std::string cached = options.cache_dir + "/" + cache_file_name(url);
    // Read under a shared lock, which keeps eviction away from it.
    UniqueFd entry = cache::open_entry(cached);
    if (entry.valid()) {
      return open_file_source_fd(url, cached, std::move(entry), options.readahead_bytes);
    }
    cache::make_dirs(options.cache_dir, url);
    return open_caching_source(
        open_pipe_source(url, command, options.pipe_timeout_s, options.cancel), options.cache_dir,
        cached, options.cache_limit_bytes, options.cache_fsync);
  }
  if (is_remote_url(url)) {
    CHUTE_CHECK(options.remote != nullptr, kUsage,
                "cannot read '" << url << "' here: remote urls are read through chute.remote "
                                << "(pip install 'chute[remote]'), or wrap it in a pipe, e.g. "
                                << "'pipe:curl -sf " << url << "'");
    return open_remote_source(url, options);
  }
  std::string path = url;
  if (starts_with(url, "file://")) {
    path = url.substr(7);
  } else if (starts_with(url, "file:")) {
    path = url.substr(5);
  } else {
    const size_t scheme_end = url.find("://");
    const size_t slash = url.find('/');
    if (scheme_end != std::string::npos && scheme_end != 0 && slash > scheme_end) {
      CHUTE_CHECK(false, kUsage,
                  "unsupported url '" << url << "': chute reads local files, pipe: commands and "
                                      << remote_scheme_list()
                                      << " urls; for others use a pipe, e.g. "
                                      << "'pipe:curl -sf " << url << "'");
    }
  }
  CHUTE_CHECK(!path.empty(), kUsage, "empty file path in url '" << url << "'");
  return open_file_source(url, path, options.readahead_bytes);
}

std::unique_ptr<ByteSource> open_source(const std::string& url, const SourceOptions& options) {
  return open_decompressed(open_stored_source(url, options));
}

std::unique_ptr<ByteSource> open_caching_source(std::unique_ptr<ByteSource> inner,
                                                const std::string& cache_dir,
                                                const std::string& final_path,
                                                uint64_t cache_limit, bool fsync) {
  return std::make_unique<CachingSource>(std::move(inner), cache_dir, final_path, cache_limit,
                                         fsync);
}

}  // namespace chute

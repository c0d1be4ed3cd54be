// Sequential byte sources for shards: a local file (large reads with readahead
// hints) or the stdout of a `pipe:COMMAND`. With a cache directory, a pipe
// source is copied into the cache as it is read (renamed into place only when
// complete) and later opens read the cached file.
//
// URLs: `pipe:COMMAND` runs COMMAND with /bin/sh -c (stdin is /dev/null, its
// own process group, SIGPIPE at its default so it dies when we stop reading);
// `file:PATH`, `file://PATH` and plain paths are local files; the object-store
// schemes of remote_source.h (http(s)://, s3://, gs://, az://, abfs://,
// hf://, ...) are read through SourceOptions::remote. Any other `scheme://`
// URL, or a remote one without SourceOptions::remote, is a kUsage error.
//
// Cache naming (cache_file_name): `<hash>-<base>` where hash is the 16 hex
// digits of the 64-bit FNV-1a hash of the full url string (including
// "pipe:"), and base is, for readability only, the last path component of the
// last whitespace-separated command token that contains '/' or '.' (falling
// back to the last token), cut at '?' or '#', with every byte outside
// [A-Za-z0-9._-] replaced by '_' and shortened to 80 bytes ("shard" if empty).
// Example: "pipe:curl -s https://h/d/train-0001.tar?sig=x" ->
// "<16 hex>-train-0001.tar". While being written the file is
// `<name>+tmp.<pid>.<n>` (n counts within the process, so two readers of one
// url never share a temporary); it is renamed to `<name>` only after the pipe
// reached EOF, its command exited with status 0 and the reader called
// mark_complete() (the tar reader does at a valid end of archive). A cache
// write failure (e.g. a full disk) drops the cache entry but does not fail
// the read. Pipe and remote entries share one directory, its size limit and
// its least-recently-used eviction (see object_cache.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace chute {

class MappedFile;

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to n bytes into dst; returns the count, 0 at the end. Throws
  // chute::Error (kIo) on failure; a pipe whose command exits non-zero throws
  // at the end with the exit status and the tail of its stderr.
  virtual size_t read(uint8_t* dst, size_t n) = 0;
  // The url as the user gave it, for error messages.
  virtual const std::string& url() const = 0;
  // Called by a reader that consumed the whole stream (read() returned 0) and
  // found its content valid. A caching source publishes its cache entry only
  // then, so a pipe that exits 0 after sending a truncated tar is not cached.
  virtual void mark_complete() {}
  // The whole source mapped for reading in place, or nullptr where it cannot
  // be (a pipe, a cache being written, a file the kernel will not map). A
  // reader that uses the mapping calls will_read() as it advances instead of
  // read(), so that a local file keeps its readahead hints.
  virtual std::shared_ptr<MappedFile> map_file() { return nullptr; }
  virtual void will_read(uint64_t /*offset*/) {}
};

class FetchQueue;

// What the sources opened with one SourceOptions count, read by their owner
// (an engine's stats).
struct SourceCounters {
  // Cache entries whose bytes no longer matched the checksum made when they
  // were downloaded: dropped and fetched again.
  std::atomic<uint64_t> cache_corrupt_refetches{0};
};

struct SourceOptions {
  std::string cache_dir;       // empty: no caching of pipe: or remote sources
  uint64_t cache_limit_bytes = 0;  // > 0: least recently used entries go beyond this
  bool cache_fsync = true;     // flush an entry to disk before publishing it
  double pipe_timeout_s = 0;   // > 0: a pipe that produces no byte for this long fails (kTimeout)
  size_t readahead_bytes = size_t{8} << 20;
  // When set, a `pipe:` read blocked on a silent command checks this flag
  // every kCancelPollMs and gives up (kIo) once it is true, so an engine
  // being closed never waits for a stalled command. Owned by the caller and
  // must outlive the source.
  const std::atomic<bool>* cancel = nullptr;
  // Remote urls are read through this queue (its fetcher lives in
  // chute.remote); null: they are a usage error.
  std::shared_ptr<FetchQueue> remote;
  std::shared_ptr<SourceCounters> counters;  // null: not counted
};

// How often a blocked pipe read looks at SourceOptions::cancel.
constexpr int kCancelPollMs = 50;

// A gzip-compressed source is inflated as it is read (see io/gzip_source.h).
std::unique_ptr<ByteSource> open_source(const std::string& url, const SourceOptions& options);
// The bytes of `url` as stored, compressed or not (for readers of raw objects).
std::unique_ptr<ByteSource> open_stored_source(const std::string& url,
                                               const SourceOptions& options);

// The file name (no directory) under which a `pipe:` or remote url is cached; see above.
std::string cache_file_name(const std::string& url);

}  // namespace chute

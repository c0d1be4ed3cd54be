// Sequential byte sources for shards: a local file (pread with readahead
// hints) or the stdout of a `pipe:COMMAND`. With a cache directory, a pipe
// source is copied into the cache as it is read (renamed into place only when
// complete) and later opens read the cached file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace chute {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to n bytes into dst; returns the count, 0 at the end. Throws
  // chute::Error (kIo) on failure; a pipe whose command exits non-zero throws
  // at the end with the exit status and the tail of its stderr.
  virtual size_t read(uint8_t* dst, size_t n) = 0;
  // The url as the user gave it, for error messages.
  virtual const std::string& url() const = 0;
};

struct SourceOptions {
  std::string cache_dir;       // empty: no caching of pipe: sources
  double pipe_timeout_s = 0;   // > 0: a pipe that produces no byte for this long fails (kTimeout)
  size_t readahead_bytes = size_t{8} << 20;
};

std::unique_ptr<ByteSource> open_source(const std::string& url, const SourceOptions& options);

}  // namespace chute

// The concrete sources behind open_source(); internal to csrc/io.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "io/byte_source.h"
#include "io/unique_fd.h"

namespace chute {

// `display_url` names the source in errors; `path` is what is opened.
std::unique_ptr<ByteSource> open_file_source(const std::string& display_url,
                                             const std::string& path, size_t readahead_bytes);
// The same over a descriptor already open on `path` (a cache entry, whose
// shared lock is held through it).
std::unique_ptr<ByteSource> open_file_source_fd(const std::string& display_url,
                                                const std::string& path, UniqueFd fd,
                                                size_t readahead_bytes);

// `cancel` may be null; see SourceOptions::cancel.
std::unique_ptr<ByteSource> open_pipe_source(const std::string& url, const std::string& command,
                                             double timeout_s,
                                             const std::atomic<bool>* cancel = nullptr);

// Copies everything read from `inner` into `final_path` (through a temporary
// that is renamed only after a complete read), then keeps the cache
// directory under `cache_limit` bytes (0: no limit).
std::unique_ptr<ByteSource> open_caching_source(std::unique_ptr<ByteSource> inner,
                                                const std::string& cache_dir,
                                                const std::string& final_path,
                                                uint64_t cache_limit, bool fsync);

}  // namespace chute

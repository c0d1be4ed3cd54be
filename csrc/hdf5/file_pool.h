// A bounded set of open file descriptors shared by the engine threads. Files
// are registered once with the identity they had when described (size, mtime,
// inode); they are opened on demand, the least recently used is closed when
// more than `max_open` are open, and a reopen that finds a different file
// fails instead of reading someone else's bytes.
//
// A remote url (io/remote_source.h's schemes) registered here is an object
// in a store, opened through the pool's FetchQueue (set_remote): its identity
// is its size and version (ETag), checked by a HEAD at open and by If-Match
// on every range (io/remote_ranges.h).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/remote_ranges.h"

namespace chute {
class FetchQueue;
}

namespace chute::h5 {

struct FileIdentity {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  std::string version;  // remote objects: the ETag (else modification time) described
};

// One open descriptor (or remote object); closed when the last user lets go,
// so eviction never closes a descriptor another thread is reading from (the
// pool may therefore briefly hold up to max_open + threads descriptors).
class OpenFile {
 public:
  OpenFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  OpenFile(std::unique_ptr<RemoteRanges> remote, std::string path)
      : remote_(std::move(remote)), path_(std::move(path)) {}
  ~OpenFile();
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
  // -1 for a remote object.
  int fd() const { return fd_; }
  // Null for a local file.
  const RemoteRanges* remote() const { return remote_.get(); }
  const std::string& path() const { return path_; }
  // pread_full for a local file; a remote object's ranged GET (exact, or
  // an error naming the url and range).
  size_t read_at(uint8_t* dst, size_t n, uint64_t offset) const;

 private:
  int fd_ = -1;
  std::unique_ptr<RemoteRanges> remote_;
  std::string path_;
};

class FilePool {
 public:
  explicit FilePool(size_t max_open);

  // How remote urls are read; without it they cannot be opened.
  void set_remote(std::shared_ptr<FetchQueue> queue);

  // Returns the id for `path`; registering a path again updates its identity
  // (the newest description wins).
  uint32_t register_file(const std::string& path, const FileIdentity& identity);

  std::shared_ptr<OpenFile> acquire(uint32_t id);

  const std::string& path(uint32_t id) const;
  FileIdentity identity(uint32_t id) const;

  uint64_t opens() const;
  size_t open_count() const;

 private:
  struct Entry {
    std::string path;
    FileIdentity identity;
    std::shared_ptr<OpenFile> file;  // null when closed
    std::list<uint32_t>::iterator lru;
  };
  std::shared_ptr<OpenFile> open_remote(const std::string& url, const FileIdentity& identity);

  size_t max_open_;
  std::shared_ptr<FetchQueue> remote_;
  mutable std::mutex mutex_;
  // deque-like stability: entries are never removed, and paths/identities are
  // only written under the mutex before any reader can see the id.
  std::vector<std::unique_ptr<Entry>> entries_;
  std::unordered_map<std::string, uint32_t> by_path_;
  std::list<uint32_t> lru_;  // front: most recent; only open files
  uint64_t opens_ = 0;
};

// Reads exactly n bytes at `offset` unless the file ends first; returns the
// count read. Retries EINTR and partial reads; throws kIo on a read error.
size_t pread_full(int fd, uint8_t* dst, size_t n, uint64_t offset, const std::string& path);

// Throws kIo when the open file no longer has the size/mtime it had when
// described (truncated, rewritten); the message names the dataset, the row
// and the byte offset about to be read. A remote object is checked by its
// reads instead (If-Match).
void check_unchanged(const OpenFile& file, const FileIdentity& identity,
                     const std::string& dataset, int64_t row, uint64_t offset);

}  // namespace chute::h5

// A cache directory shared by every process of a node (the ranks of a job,
// or several jobs). Entries are plain files named by cache_file_name(url);
// beside an entry of a remote object live, while needed:
//
//   <name>+meta   the object's size and version (ETag, else modification
//                 time) as fetched, and the CRC-32C of its bytes computed
//                 while they were written; written after the data is in
//                 place, so data without matching meta is never trusted
//   <name>+lock   held (exclusive flock) by the one process downloading the
//                 object; its content is the size and version being fetched,
//                 so that others can follow the download; unlinked by its
//                 owner before it lets go
//   <name>+part   the download in progress, written in order: its size is
//                 how far it got; renamed to <name> when complete
//
// ('+' never occurs in cache_file_name's output, so these never collide with
// an entry.) A `pipe:` entry has no meta, lock or part: it is published by
// its own caching source through a `<name>+tmp.<pid>.<n>` temporary.
//
// Readers of an entry hold a shared flock on it for as long as they read;
// eviction (least recently used first, by the modification time that every
// open refreshes) takes an exclusive non-blocking lock, so an entry being
// read is never evicted. A reader that opened an entry just as it was
// evicted notices (the name no longer leads to its file) and treats it as
// missing.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "io/unique_fd.h"

namespace chute::cache {

struct ObjectVersion {
  uint64_t size = 0;
  std::string version;
  bool operator==(const ObjectVersion& o) const { return size == o.size && version == o.version; }
};

// mkdir -p; a concurrent creator is not an error. `url` names the reader in errors.
void make_dirs(const std::string& dir, const std::string& url);

// Opens an entry for reading with a shared lock held on the returned
// descriptor, refreshing its last-use time. Invalid if it does not exist or
// was evicted meanwhile.
UniqueFd open_entry(const std::string& path);

// What is recorded beside a remote entry.
struct EntryMeta {
  ObjectVersion version;
  uint32_t crc32c = 0;  // of the entry's bytes
};

// The meta of a remote entry; false if none, unreadable, or without a
// checksum (an entry written before checksums: fetched again).
bool read_meta(const std::string& entry_path, EntryMeta& out);
// Records `meta` for `entry_path` atomically (a temporary renamed into place).
void write_meta(const std::string& entry_path, const std::string& url, const EntryMeta& meta);

// Whether the first `size` bytes of `fd` have the CRC-32C `expected` (a
// short file does not). Reads in blocks, giving up (false) once `cancel`
// is set.
bool verify_entry(int fd, uint64_t size, uint32_t expected, const std::atomic<bool>* cancel);

// Removes an entry found corrupt, and its meta, if `path` still names the
// file open as `fd` (a concurrent reader may have replaced it already).
void drop_entry(const std::string& path, int fd);

// The exclusive right to download one object.
class DownloadLock {
 public:
  DownloadLock() = default;
  ~DownloadLock() { release(); }
  DownloadLock(DownloadLock&&) = default;
  DownloadLock& operator=(DownloadLock&&) = default;

  // Takes `<entry>+lock` without waiting; false if another process (or
  // another reader of this one) holds it.
  bool try_acquire(const std::string& entry_path);
  // What this download fetches, for followers (see read_lock_note).
  void note(const ObjectVersion& v);
  bool held() const { return fd_.valid(); }
  // Unlinks the lock file, then lets go of it.
  void release();

 private:
  std::string path_;
  UniqueFd fd_;
};

// Another process's download, seen from outside: what it fetches and
// whether its owner is still at it.
class LockWatch {
 public:
  // False if no download of the entry is in progress.
  bool open(const std::string& entry_path);
  // What the owner noted; false while it has not written it yet.
  bool read_note(ObjectVersion& out) const;
  // Whether the owner still holds the lock (it lets go when done or dead).
  bool owner_alive() const;

 private:
  UniqueFd fd_;
};

// Makes room for `incoming` more bytes under `limit` (0: no limit) by
// evicting entries of `dir`, least recently used first, skipping those being
// read; downloads in progress count at their whole size. Returns whether
// `incoming` now fits. Also removes what dead
// processes left behind (part, lock and temporary files untouched for a
// while whose owner is gone).
bool make_room(const std::string& dir, uint64_t limit, uint64_t incoming);

// Moves a finished temporary into place (after fdatasync when `fsync`).
// Returns false (and removes the temporary) if that failed.
bool publish(int fd, const std::string& tmp_path, const std::string& final_path, bool fsync);

}  // namespace chute::cache

#include "hdf5/file_pool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/error.h"
#include "io/remote_source.h"

namespace chute::h5 {

namespace {

int64_t mtime_ns_of(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

OpenFile::~OpenFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t OpenFile::read_at(uint8_t* dst, size_t n, uint64_t offset) const {
  if (remote_ == nullptr) return pread_full(fd_, dst, n, offset, path_);
  remote_->read(offset, n, dst);
  return n;
}

FilePool::FilePool(size_t max_open) : max_open_(max_open == 0 ? 1 : max_open) {}

void FilePool::set_remote(std::shared_ptr<FetchQueue> queue) {
  std::lock_guard<std::mutex> lock(mutex_);
  remote_ = std::move(queue);
}

std::shared_ptr<OpenFile> FilePool::open_remote(const std::string& url,
                                                const FileIdentity& identity) {
  std::shared_ptr<FetchQueue> queue;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue = remote_;
  }
  CHUTE_CHECK(queue != nullptr, kUsage,
              "cannot read '" << url << "': remote urls are read through chute.remote");
  auto ranges = std::make_unique<RemoteRanges>(url, std::move(queue));
  CHUTE_CHECK(ranges->size() == identity.size &&
                  (identity.version.empty() || ranges->version() == identity.version),
              kIo,
              "object '" << url << "' was replaced or modified after the dataset was opened (size "
                         << identity.size << " -> " << ranges->size() << ", version "
                         << identity.version << " -> " << ranges->version()
                         << "); reopen the dataset");
  return std::make_shared<OpenFile>(std::move(ranges), url);
}

uint32_t FilePool::register_file(const std::string& path, const FileIdentity& identity) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_path_.find(path);
  if (it != by_path_.end()) {
    Entry& e = *entries_[it->second];
    e.identity = identity;
    return it->second;
  }
  const auto id = static_cast<uint32_t>(entries_.size());
  auto entry = std::make_unique<Entry>();
  entry->path = path;
  entry->identity = identity;
  entries_.push_back(std::move(entry));
  by_path_.emplace(path, id);
  return id;
}

const std::string& FilePool::path(uint32_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.at(id)->path;
}

FileIdentity FilePool::identity(uint32_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.at(id)->identity;
}

uint64_t FilePool::opens() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return opens_;
}

size_t FilePool::open_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lru_.size();
}

std::shared_ptr<OpenFile> FilePool::acquire(uint32_t id) {
  std::string path;
  FileIdentity identity;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry& e = *entries_.at(id);
    if (e.file) {
      lru_.splice(lru_.begin(), lru_, e.lru);
      return e.file;
    }
    path = e.path;
    identity = e.identity;
  }
  // Open outside the lock: a slow filesystem (or store) must not stall the other threads.
  std::shared_ptr<OpenFile> file;
  if (is_remote_url(path)) {
    file = open_remote(path, identity);
  } else {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    int err = errno;
    CHUTE_CHECK(fd >= 0, kIo, "cannot open '" << path << "'" << OsFailure(err, path));
    file = std::make_shared<OpenFile>(fd, path);
    struct stat st {};
    const bool stated = ::fstat(fd, &st) == 0;
    err = errno;
    CHUTE_CHECK(stated, kIo, "cannot stat '" << path << "'" << OsFailure(err, path));
    CHUTE_CHECK(static_cast<uint64_t>(st.st_ino) == identity.inode &&
                    static_cast<uint64_t>(st.st_size) == identity.size &&
                    mtime_ns_of(st) == identity.mtime_ns,
                kIo,
                "file '" << path << "' was replaced or modified after the dataset was opened (size "
                         << identity.size << " -> " << st.st_size << ", inode " << identity.inode
                         << " -> " << st.st_ino << "); reopen the dataset");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = *entries_.at(id);
  if (e.file) {  // another thread opened it meanwhile; ours closes on return
    lru_.splice(lru_.begin(), lru_, e.lru);
    return e.file;
  }
  opens_ += 1;
  e.file = file;
  lru_.push_front(id);
  e.lru = lru_.begin();
  while (lru_.size() > max_open_) {
    const uint32_t victim = lru_.back();
    lru_.pop_back();
    entries_[victim]->file.reset();
  }
  return file;
}

size_t pread_full(int fd, uint8_t* dst, size_t n, uint64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, dst + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      CHUTE_CHECK(false, kIo,
                  "read of " << n << " bytes at offset " << offset << " in '" << path
                             << "' failed" << OsFailure(err, path));
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

void check_unchanged(const OpenFile& file, const FileIdentity& identity,
                     const std::string& dataset, int64_t row, uint64_t offset) {
  if (file.remote() != nullptr) return;
  struct stat st {};
  const bool stated = ::fstat(file.fd(), &st) == 0;
  const int err = errno;
  CHUTE_CHECK(stated, kIo, "cannot stat '" << file.path() << "'" << OsFailure(err, file.path()));
  CHUTE_CHECK(static_cast<uint64_t>(st.st_size) == identity.size &&
                  mtime_ns_of(st) == identity.mtime_ns,
              kIo,
              "file '" << file.path() << "' changed after the dataset was opened (size "
                       << identity.size << " -> " << st.st_size << " bytes) while reading dataset '"
                       << dataset << "' row " << row << " at byte offset " << offset
                       << "; reopen the dataset");
}

}  // namespace chute::h5

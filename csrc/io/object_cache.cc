#include "io/object_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"
#include "io/crc32c.h"

namespace chute::cache {
namespace {

// Leftovers of a process that died mid-download (or mid-eviction) are
// removed once nobody has touched them for this long.
constexpr int64_t kStaleSeconds = 600;

bool same_file(int fd, const std::string& path) {
  struct stat a {}, b {};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

int flock_retry(int fd, int op) {
  int rc;
  do {
    rc = ::flock(fd, op);
  } while (rc != 0 && errno == EINTR);
  return rc;
}

// An entry's name: 16 hex digits, '-', and no '+' (see the header).
bool is_entry_name(const std::string& name) {
  if (name.size() < 18 || name[16] != '-' || name.find('+') != std::string::npos) return false;
  return std::all_of(name.begin(), name.begin() + 16, [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

// A `+part`, `+lock` or `+tmp.` file whose writer is gone, or a `+meta` whose entry is.
bool is_stale_leftover(const std::string& dir, const std::string& name, const struct stat& st) {
  const int64_t age = static_cast<int64_t>(::time(nullptr)) - static_cast<int64_t>(st.st_mtime);
  if (age < kStaleSeconds) return false;
  const size_t plus = name.find('+');
  if (plus == std::string::npos || !is_entry_name(name.substr(0, plus))) return false;
  const std::string entry = dir + "/" + name.substr(0, plus);
  const std::string kind = name.substr(plus);
  if (kind == "+part" || kind == "+lock") {
    // (A lock file is only ever taken after checking that it is still
    // linked, so removing one nobody holds is safe.)
    LockWatch watch;
    return !watch.open(entry);
  }
  if (kind == "+meta") {
    struct stat e {};
    return ::stat(entry.c_str(), &e) != 0;
  }
  return kind.rfind("+tmp.", 0) == 0;
}

}  // namespace

void make_dirs(const std::string& dir, const std::string& url) {
  std::string path;
  size_t i = 0;
  while (i <= dir.size()) {
    size_t slash = dir.find('/', i);
    if (slash == std::string::npos) slash = dir.size();
    path = dir.substr(0, slash);
    i = slash + 1;
    if (path.empty()) continue;
    if (::mkdir(path.c_str(), 0777) != 0) {
      const int err = errno;
      struct stat st;
      CHUTE_CHECK(err == EEXIST && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode), kIo,
                  "cannot create cache directory '" << path << "' for '" << url << "'"
                                                    << OsFailure(err, path));
    }
  }
}

UniqueFd open_entry(const std::string& path) {
  UniqueFd fd(open_cloexec(path, O_RDONLY));
  if (!fd.valid()) return fd;
  // An evictor holds its exclusive lock only while it unlinks; waiting is
  // bounded anyway, and a lock that stays taken counts as a miss.
  bool locked = false;
  for (int i = 0; i < 1000 && !locked; ++i) {
    locked = flock_retry(fd.get(), LOCK_SH | LOCK_NB) == 0;
    if (!locked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!locked || !same_file(fd.get(), path)) return UniqueFd();
  // The last-use time that eviction orders by; a cache shared by several
  // users may refuse it, which costs only the ordering.
  (void)::futimens(fd.get(), nullptr);
  return fd;
}

bool read_meta(const std::string& entry_path, EntryMeta& out) {
  UniqueFd fd(open_cloexec(entry_path + "+meta", O_RDONLY));
  if (!fd.valid()) return false;
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t r = ::read(fd.get(), buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    text.append(buf, static_cast<size_t>(r));
    if (text.size() > 65536) return false;
  }
  std::istringstream in(text);
  std::string line;
  bool have_size = false, have_version = false, have_crc = false;
  while (std::getline(in, line)) {
    if (line.rfind("size ", 0) == 0) {
      try {
        out.version.size = std::stoull(line.substr(5));
        have_size = true;
      } catch (const std::exception&) {
        return false;
      }
    } else if (line.rfind("version ", 0) == 0) {
      out.version.version = line.substr(8);
      have_version = true;
    } else if (line.rfind("crc32c ", 0) == 0) {
      const std::string hex = line.substr(7);
      if (hex.size() != 8 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
        return false;
      }
      out.crc32c = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
      have_crc = true;
    }
  }
  return have_size && have_version && have_crc;
}

namespace {

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

std::string note_text(const ObjectVersion& v) {
  return "size " + std::to_string(v.size) + "\nversion " + one_line(v.version) + "\n";
}

bool parse_note(const std::string& text, ObjectVersion& out) {
  const std::string size_key = "size ", version_key = "\nversion ";
  const size_t v = text.find(version_key);
  if (text.rfind(size_key, 0) != 0 || v == std::string::npos || text.back() != '\n') return false;
  try {
    out.size = std::stoull(text.substr(size_key.size(), v - size_key.size()));
  } catch (const std::exception&) {
    return false;
  }
  out.version = text.substr(v + version_key.size(), text.size() - v - version_key.size() - 1);
  return true;
}

bool write_all(int fd, const std::string& text) {
  const char* p = text.data();
  size_t n = text.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

void write_meta(const std::string& entry_path, const std::string& url, const EntryMeta& meta) {
  const std::string tmp = entry_path + "+tmp.meta." + std::to_string(::getpid());
  UniqueFd fd(open_cloexec(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666));
  if (!fd.valid()) return;  // the entry then reads as unverified: refetched, never trusted
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", static_cast<unsigned>(meta.crc32c));
  const bool ok = write_all(fd.get(), note_text(meta.version) + "crc32c " + crc + "\nurl " +
                                          one_line(url) + "\n");
  fd.reset();
  if (!ok || ::rename(tmp.c_str(), (entry_path + "+meta").c_str()) != 0) {
    (void)::unlink(tmp.c_str());
  }
}

bool verify_entry(int fd, uint64_t size, uint32_t expected, const std::atomic<bool>* cancel) {
  // Large enough that the checksum, not the calls, sets the pace.
  std::vector<uint8_t> block(size_t{4} << 20);
  uint32_t crc = 0;
  uint64_t at = 0;
  while (at < size) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) return false;
    const size_t want = static_cast<size_t>(std::min<uint64_t>(block.size(), size - at));
    const ssize_t r = ::pread(fd, block.data(), want, static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    crc = crc32c(crc, block.data(), static_cast<size_t>(r));
    at += static_cast<uint64_t>(r);
  }
  return crc == expected;
}

void drop_entry(const std::string& path, int fd) {
  if (!same_file(fd, path)) return;
  (void)::unlink(path.c_str());
  (void)::unlink((path + "+meta").c_str());
}

bool DownloadLock::try_acquire(const std::string& entry_path) {
  release();
  const std::string path = entry_path + "+lock";
  // The previous owner unlinks the file before letting go; a lock taken on a
  // file that is no longer under the name is worthless, so check and retry.
  for (int attempt = 0; attempt < 8; ++attempt) {
    UniqueFd fd(open_cloexec(path, O_RDWR | O_CREAT, 0666));
    if (!fd.valid()) return false;
    if (flock_retry(fd.get(), LOCK_EX | LOCK_NB) != 0) return false;
    if (same_file(fd.get(), path)) {
      (void)::ftruncate(fd.get(), 0);
      path_ = path;
      fd_ = std::move(fd);
      return true;
    }
  }
  return false;
}

void DownloadLock::note(const ObjectVersion& v) {
  if (fd_.valid()) (void)write_all(fd_.get(), note_text(v));
}

void DownloadLock::release() {
  if (!fd_.valid()) return;
  (void)::unlink(path_.c_str());
  fd_.reset();
}

bool LockWatch::open(const std::string& entry_path) {
  fd_.reset(open_cloexec(entry_path + "+lock", O_RDONLY));
  return fd_.valid() && owner_alive();
}

bool LockWatch::read_note(ObjectVersion& out) const {
  char buf[4096];
  ssize_t r;
  do {
    r = ::pread(fd_.get(), buf, sizeof buf, 0);
  } while (r < 0 && errno == EINTR);
  return r > 0 && parse_note(std::string(buf, static_cast<size_t>(r)), out);
}

bool LockWatch::owner_alive() const {
  if (!fd_.valid()) return false;
  if (flock_retry(fd_.get(), LOCK_SH | LOCK_NB) != 0) return true;
  (void)flock_retry(fd_.get(), LOCK_UN);
  return false;
}

bool make_room(const std::string& dir, uint64_t limit, uint64_t incoming) {
  if (limit == 0) return true;
  if (incoming > limit) return false;
  struct Entry {
    std::string path;
    uint64_t size;
    struct timespec used;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const size_t plus = name.find('+');
    if (is_entry_name(name)) {
      entries.push_back({path, static_cast<uint64_t>(st.st_size), st.st_mtim});
      total += static_cast<uint64_t>(st.st_size);
    } else if (plus != std::string::npos && name.compare(plus, std::string::npos, "+lock") == 0 &&
               is_entry_name(name.substr(0, plus))) {
      // A download in progress will publish its whole object: its room is
      // taken already, or concurrent downloads would overfill the cache.
      LockWatch watch;
      ObjectVersion downloading;
      if (watch.open(dir + "/" + name.substr(0, plus)) && watch.read_note(downloading)) {
        total += downloading.size;
      } else if (is_stale_leftover(dir, name, st)) {
        stale.push_back(path);
      }
    } else if (is_stale_leftover(dir, name, st)) {
      stale.push_back(path);
    }
  }
  ::closedir(d);
  for (const std::string& p : stale) (void)::unlink(p.c_str());
  if (total + incoming <= limit) return true;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.used.tv_sec != b.used.tv_sec ? a.used.tv_sec < b.used.tv_sec
                                          : a.used.tv_nsec < b.used.tv_nsec;
  });
  for (const Entry& e : entries) {
    if (total + incoming <= limit) break;
    UniqueFd fd(open_cloexec(e.path, O_RDONLY));
    if (!fd.valid()) continue;
    // A reader's shared lock makes this fail: that entry stays.
    if (flock_retry(fd.get(), LOCK_EX | LOCK_NB) != 0 || !same_file(fd.get(), e.path)) continue;
    if (::unlink(e.path.c_str()) == 0) {
      (void)::unlink((e.path + "+meta").c_str());
      total -= std::min(total, e.size);
    }
  }
  return total + incoming <= limit;
}

bool publish(int fd, const std::string& tmp_path, const std::string& final_path, bool fsync) {
  // Flushed before the rename so that a crash cannot leave a short file under the final name.
  const bool ok = (!fsync || ::fdatasync(fd) == 0) &&
                  ::rename(tmp_path.c_str(), final_path.c_str()) == 0;
  if (!ok) (void)::unlink(tmp_path.c_str());
  return ok;
}

}  // namespace chute::cache

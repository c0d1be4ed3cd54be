#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/error.h"
#include "io/mapped_region.h"
#include "io/sources.h"
#include "io/unique_fd.h"

namespace chute {
namespace {

class FileSource final : public ByteSource {
 public:
  FileSource(std::string url, std::string path, size_t readahead)
      : url_(std::move(url)), path_(std::move(path)), readahead_(readahead) {
    const int fd = open_cloexec(path_, O_RDONLY);
    const int err = errno;
    CHUTE_CHECK(fd >= 0, kIo, "cannot open '" << url_ << "'" << path_note() << OsFailure(err, path_));
    fd_.reset(fd);
    start();
  }

  FileSource(std::string url, std::string path, UniqueFd fd, size_t readahead)
      : url_(std::move(url)), path_(std::move(path)), readahead_(readahead), fd_(std::move(fd)) {
    start();
  }

  size_t read(uint8_t* dst, size_t n) override {
    for (;;) {
      const ssize_t r = ::read(fd_.get(), dst, n);
      if (r >= 0) {
        offset_ += static_cast<uint64_t>(r);
        if (readahead_ > 0 && offset_ + readahead_ / 2 >= advised_until_) advise();
        return static_cast<size_t>(r);
      }
      const int err = errno;
      if (err == EINTR) continue;
      CHUTE_CHECK(false, kIo, "read error in '" << url_ << "'" << path_note() << " at offset "
                                                << offset_ << OsFailure(err, path_));
    }
  }

  const std::string& url() const override { return url_; }

  std::shared_ptr<MappedFile> map_file() override {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) return nullptr;
    return MappedFile::map(fd_.get(), static_cast<uint64_t>(st.st_size));
  }

  void will_read(uint64_t offset) override {
    offset_ = offset;
    if (readahead_ > 0 && offset_ + readahead_ / 2 >= advised_until_) advise();
  }

 private:
  void start() {
    // SEQUENTIAL doubles the kernel's readahead window; the WILLNEED hints in
    // read() keep `readahead_` bytes in flight on a cold cache.
    (void)::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    advise();
  }

  std::string path_note() const { return path_ == url_ ? std::string() : " (file '" + path_ + "')"; }

  void advise() {
    if (readahead_ == 0) return;
    const uint64_t from = std::max(advised_until_, offset_);
    (void)::posix_fadvise(fd_.get(), static_cast<off_t>(from), static_cast<off_t>(readahead_),
                          POSIX_FADV_WILLNEED);
    advised_until_ = from + readahead_;
  }

  std::string url_;
  std::string path_;
  size_t readahead_;
  UniqueFd fd_;
  uint64_t offset_ = 0;
  uint64_t advised_until_ = 0;
};

}  // namespace

std::unique_ptr<ByteSource> open_file_source(const std::string& display_url,
                                             const std::string& path, size_t readahead_bytes) {
  return std::make_unique<FileSource>(display_url, path, readahead_bytes);
}

std::unique_ptr<ByteSource> open_file_source_fd(const std::string& display_url,
                                                const std::string& path, UniqueFd fd,
                                                size_t readahead_bytes) {
  return std::make_unique<FileSource>(display_url, path, std::move(fd), readahead_bytes);
}

}  // namespace chute

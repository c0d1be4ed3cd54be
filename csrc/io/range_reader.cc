#include "io/range_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/error.h"
#include "io/unique_fd.h"

namespace chute {
namespace {

class LocalRangeReader final : public RangeReader {
 public:
  LocalRangeReader(std::string url, std::string path, const ShardIdentity& expected)
      : url_(std::move(url)), path_(std::move(path)) {
    const int fd = open_cloexec(path_, O_RDONLY);
    int err = errno;
    CHUTE_CHECK(fd >= 0, kIo, "cannot open shard '" << url_ << "'" << OsFailure(err, path_));
    fd_.reset(fd);
    struct stat st {};
    const bool stated = ::fstat(fd_.get(), &st) == 0;
    err = errno;
    CHUTE_CHECK(stated, kIo, "cannot stat shard '" << url_ << "'" << OsFailure(err, path_));
    const int64_t size = static_cast<int64_t>(st.st_size);
    const int64_t mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                             static_cast<int64_t>(st.st_mtim.tv_nsec);
    CHUTE_CHECK((expected.size < 0 || expected.size == size) &&
                    (expected.mtime_ns < 0 || expected.mtime_ns == mtime_ns),
                kData, "shard '" << url_ << "' changed after it was indexed (size " << size
                                 << " and modification time " << mtime_ns << " ns, indexed with "
                                 << expected.size << " and " << expected.mtime_ns
                                 << "): its index no longer describes it; rebuild the index");
  }

  void read(uint64_t offset, size_t size, uint8_t* dst) const override {
    size_t done = 0;
    while (done < size) {
      const ssize_t r = ::pread(fd_.get(), dst + done, size - done,
                                static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      const int err = errno;
      CHUTE_CHECK(r >= 0, kIo, "read error in shard '" << url_ << "' at offset " << offset + done
                                                        << OsFailure(err, path_));
      if (r == 0) {
        struct stat st {};
        const int64_t now = ::fstat(fd_.get(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
        CHUTE_CHECK(false, kData,
                    "shard '" << url_ << "' now ends at offset " << now << ", before the end of the bytes ["
                              << offset << ", " << offset + size
                              << ") its index points at: the shard changed after it was indexed");
      }
      done += static_cast<size_t>(r);
    }
  }

  const std::string& url() const override { return url_; }

 private:
  std::string url_;
  std::string path_;
  UniqueFd fd_;
};

}  // namespace

std::unique_ptr<RangeReader> open_local_range_reader(const std::string& url,
                                                     const std::string& path,
                                                     const ShardIdentity& expected) {
  return std::make_unique<LocalRangeReader>(url, path, expected);
}

}  // namespace chute

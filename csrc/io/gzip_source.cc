#include "io/gzip_source.h"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/mapped_region.h"

namespace chute {
namespace {

// Enough bytes to tell the compressed formats apart (xz's magic is longest).
constexpr size_t kMagicBytes = 6;
// Compressed bytes read from the inner source at a time.
constexpr size_t kInputBytes = size_t{256} << 10;

bool has_prefix(const std::vector<uint8_t>& head, std::initializer_list<uint8_t> magic) {
  return head.size() >= magic.size() && std::equal(magic.begin(), magic.end(), head.begin());
}

// Reads until `n` bytes or the end: a pipe hands over what it has, which may
// be less than the magic bytes.
size_t read_full(ByteSource& source, uint8_t* dst, size_t n) {
  size_t got = 0;
  while (got < n) {
    const size_t r = source.read(dst + got, n - got);
    if (r == 0) break;
    got += r;
  }
  return got;
}

// The bytes read to recognise the format, put back in front of the rest.
class PrefixedSource final : public ByteSource {
 public:
  PrefixedSource(std::unique_ptr<ByteSource> inner, std::vector<uint8_t> prefix)
      : inner_(std::move(inner)), prefix_(std::move(prefix)) {}

  size_t read(uint8_t* dst, size_t n) override {
    if (used_ < prefix_.size()) {
      const size_t k = std::min(n, prefix_.size() - used_);
      std::memcpy(dst, prefix_.data() + used_, k);
      used_ += k;
      return k;
    }
    return inner_->read(dst, n);
  }
  const std::string& url() const override { return inner_->url(); }
  void mark_complete() override { inner_->mark_complete(); }
  // A mapping shows the file from its first byte, whatever was read.
  std::shared_ptr<MappedFile> map_file() override { return inner_->map_file(); }
  void will_read(uint64_t offset) override { inner_->will_read(offset); }

 private:
  std::unique_ptr<ByteSource> inner_;
  std::vector<uint8_t> prefix_;
  size_t used_ = 0;
};

class GzipSource final : public ByteSource {
 public:
  explicit GzipSource(std::unique_ptr<ByteSource> inner)
      : inner_(std::move(inner)), input_(kInputBytes) {
    std::memset(&z_, 0, sizeof z_);
    // 16 + MAX_WBITS: a gzip wrapper (header and CRC/length trailer) is required.
    const int rc = inflateInit2(&z_, 16 + MAX_WBITS);
    CHUTE_CHECK(rc == Z_OK, kIo, "cannot start inflating gzip stream '" << url() << "' (zlib error "
                                                                       << rc << ")");
  }
  ~GzipSource() override { inflateEnd(&z_); }
  GzipSource(const GzipSource&) = delete;
  GzipSource& operator=(const GzipSource&) = delete;

  size_t read(uint8_t* dst, size_t n) override {
    if (done_ || n == 0) return 0;
    const auto want = static_cast<uInt>(std::min<size_t>(n, UINT_MAX));
    z_.next_out = dst;
    z_.avail_out = want;
    while (z_.avail_out > 0) {
      const size_t produced = want - z_.avail_out;
      if (!in_member_) {
        // Between members: another member starts with the magic; anything
        // else after a complete member is trailing data, ignored as gzip -d does.
        if (!ensure_input(2) || z_.next_in[0] != 0x1f || z_.next_in[1] != 0x8b) {
          done_ = true;
          return produced;
        }
        inflateReset(&z_);
        in_member_ = true;
      }
      if (z_.avail_in == 0) {
        // Hand over what is inflated before blocking on more input.
        if (produced > 0) return produced;
        CHUTE_CHECK(ensure_input(1), kData,
                    "truncated gzip stream '" << url() << "': it ends inside gzip member "
                                              << members_ + 1 << " after " << consumed_
                                              << " compressed bytes (" << inflated_
                                              << " bytes inflated)");
      }
      const uInt before_in = z_.avail_in;
      const uInt before_out = z_.avail_out;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      consumed_ += before_in - z_.avail_in;
      inflated_ += before_out - z_.avail_out;
      if (rc == Z_STREAM_END) {
        in_member_ = false;
        ++members_;
        continue;
      }
      // Z_BUF_ERROR: no progress possible until more input arrives.
      CHUTE_CHECK(rc == Z_OK || rc == Z_BUF_ERROR, kData,
                  "corrupt gzip stream '" << url() << "' near compressed offset " << consumed_
                                          << ": " << (z_.msg != nullptr ? z_.msg : "zlib error")
                                          << " (zlib error " << rc << ")");
    }
    return want;
  }

  const std::string& url() const override { return inner_->url(); }
  // Complete only when every member ended and the inner source did too.
  void mark_complete() override {
    if (done_ && inner_eof_) inner_->mark_complete();
  }

 private:
  // At least `k` unread compressed bytes in input_, unless the inner source
  // ended first (then false).
  bool ensure_input(size_t k) {
    while (z_.avail_in < k && !inner_eof_) {
      if (z_.avail_in > 0 && z_.next_in != input_.data()) {
        std::memmove(input_.data(), z_.next_in, z_.avail_in);
      }
      z_.next_in = input_.data();
      const size_t r = inner_->read(input_.data() + z_.avail_in, input_.size() - z_.avail_in);
      if (r == 0) inner_eof_ = true;
      z_.avail_in += static_cast<uInt>(r);
    }
    return z_.avail_in >= k;
  }

  std::unique_ptr<ByteSource> inner_;
  std::vector<uint8_t> input_;
  z_stream z_;
  bool in_member_ = false;
  bool inner_eof_ = false;
  bool done_ = false;
  uint64_t members_ = 0;
  uint64_t consumed_ = 0;
  uint64_t inflated_ = 0;
};

// Formats webdataset reads through Python's tarfile and chute does not inflate.
const char* unsupported_compression(const std::vector<uint8_t>& head, const char** tool) {
  if (has_prefix(head, {'B', 'Z', 'h'})) {
    *tool = "bzip2 -dc";
    return "bzip2";
  }
  if (has_prefix(head, {0xfd, '7', 'z', 'X', 'Z', 0x00})) {
    *tool = "xz -dc";
    return "xz";
  }
  if (has_prefix(head, {0x28, 0xb5, 0x2f, 0xfd})) {
    *tool = "zstd -dc";
    return "zstd";
  }
  return nullptr;
}

// Recognises the format on first use, so that opening a source still reads
// nothing (a pipe's command may be slow to speak, or be cancelled): the first
// read() looks at the first bytes; map_file() looks at them in the mapping.
class DetectingSource final : public ByteSource {
 public:
  explicit DetectingSource(std::unique_ptr<ByteSource> inner)
      : url_(inner->url()), inner_(std::move(inner)) {}

  size_t read(uint8_t* dst, size_t n) override {
    if (!active_) decide();
    return active_->read(dst, n);
  }
  const std::string& url() const override { return url_; }
  void mark_complete() override {
    if (active_) {
      active_->mark_complete();
    } else {
      inner_->mark_complete();
    }
  }
  std::shared_ptr<MappedFile> map_file() override {
    if (active_) return nullptr;  // being read already
    std::shared_ptr<MappedFile> mapped = inner_->map_file();
    if (!mapped) return nullptr;
    const size_t k = static_cast<size_t>(std::min<uint64_t>(mapped->size(), kMagicBytes));
    const std::vector<uint8_t> head(mapped->data(), mapped->data() + k);
    const char* tool = nullptr;
    // A compressed file is read (and inflated, or refused) through read().
    if (has_prefix(head, {0x1f, 0x8b}) || unsupported_compression(head, &tool) != nullptr) {
      return nullptr;
    }
    return mapped;
  }
  void will_read(uint64_t offset) override {
    if (!active_) inner_->will_read(offset);
  }

 private:
  void decide() {
    std::vector<uint8_t> head(kMagicBytes);
    head.resize(read_full(*inner_, head.data(), head.size()));
    const char* tool = nullptr;
    const char* format = unsupported_compression(head, &tool);
    CHUTE_CHECK(format == nullptr, kData,
                "'" << url_ << "' is a " << format << "-compressed stream: chute reads "
                    << "tar shards plain or gzip-compressed; read it through a pipe that "
                    << "decompresses it, e.g. 'pipe:" << tool << " FILE'");
    const bool gzip = has_prefix(head, {0x1f, 0x8b});
    active_ = std::make_unique<PrefixedSource>(std::move(inner_), std::move(head));
    if (gzip) active_ = std::make_unique<GzipSource>(std::move(active_));
  }

  std::string url_;
  std::unique_ptr<ByteSource> inner_;   // until the format is known
  std::unique_ptr<ByteSource> active_;  // after: the bytes of the archive
};

}  // namespace

std::unique_ptr<ByteSource> open_decompressed(std::unique_ptr<ByteSource> source) {
  return std::make_unique<DetectingSource>(std::move(source));
}

}  // namespace chute

// Test-only: tar archives written byte by byte, and an in-memory ByteSource,
// for tar_stream_test.cc and sample_reader_test.cc. The builders follow the
// POSIX ustar layout (and GNU's variant of it) field by field, so a test
// states exactly which bytes the parser sees.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/byte_source.h"

namespace chute::test {

constexpr size_t kBlock = 512;

enum class Magic { kUstar, kGnu, kNone };

struct Header {
  std::string name;
  uint64_t size = 0;
  char type = '0';
  std::string prefix;  // ustar only
  Magic magic = Magic::kUstar;
  // When set, written verbatim into the 12-byte size field instead of `size`.
  std::string raw_size;
  bool corrupt_checksum = false;
  // Store the checksum some old tars wrote: the sum of the bytes as signed chars.
  bool signed_checksum = false;
  // Raw bytes written at these offsets of the header before its checksum
  // (the old GNU sparse map, for one).
  std::vector<std::pair<size_t, std::string>> raw_fields;
};

inline Header header(std::string name, uint64_t size, char type = '0') {
  Header h;
  h.name = std::move(name);
  h.size = size;
  h.type = type;
  return h;
}

inline void put_field(std::string& h, size_t at, size_t len, const std::string& value) {
  std::memcpy(&h[at], value.data(), std::min(len, value.size()));
}

inline std::string octal(uint64_t v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*llo", digits, static_cast<unsigned long long>(v));
  return buf;
}

inline std::string header_block(const Header& spec) {
  std::string h(kBlock, '\0');
  put_field(h, 0, 100, spec.name);
  put_field(h, 100, 8, "0000644");
  put_field(h, 108, 8, "0001750");
  put_field(h, 116, 8, "0001750");
  if (spec.raw_size.empty()) {
    put_field(h, 124, 12, octal(spec.size, 11));
  } else {
    put_field(h, 124, 12, spec.raw_size);
  }
  put_field(h, 136, 12, octal(1700000000, 11));
  h[156] = spec.type;
  if (spec.magic == Magic::kUstar) {
    put_field(h, 257, 6, std::string("ustar\0", 6));
    put_field(h, 263, 2, "00");
    put_field(h, 345, 155, spec.prefix);
  } else if (spec.magic == Magic::kGnu) {
    put_field(h, 257, 8, std::string("ustar  \0", 8));
    // GNU keeps atime/ctime where ustar has its prefix: never part of a name.
    put_field(h, 345, 12, octal(1700000001, 11));
  }
  for (const auto& [at, bytes] : spec.raw_fields) put_field(h, at, bytes.size(), bytes);
  std::memset(&h[148], ' ', 8);
  int64_t sum = 0;
  for (char c : h) {
    sum += spec.signed_checksum ? static_cast<int64_t>(static_cast<signed char>(c))
                                : static_cast<int64_t>(static_cast<unsigned char>(c));
  }
  if (spec.corrupt_checksum) sum += 1;
  std::string field = octal(static_cast<uint64_t>(sum), 6);
  field.push_back('\0');
  put_field(h, 148, 7, field);
  return h;
}

inline std::string pad(std::string s) {
  s.resize((s.size() + kBlock - 1) / kBlock * kBlock, '\0');
  return s;
}

// A header and its padded payload; the size field says payload.size() unless
// the spec says otherwise.
inline std::string member(Header spec, const std::string& payload) {
  if (spec.size == 0 && spec.raw_size.empty()) spec.size = payload.size();
  return header_block(spec) + pad(payload);
}

inline std::string file(const std::string& name, const std::string& payload) {
  Header h;
  h.name = name;
  return member(h, payload);
}

// One PAX record, "%d %s=%s\n" where the length counts itself.
inline std::string pax_record(const std::string& key, const std::string& value) {
  const size_t body = 1 + key.size() + 1 + value.size() + 1;  // " key=value\n"
  size_t len = body + 1;
  while (std::to_string(len).size() + body != len) ++len;
  return std::to_string(len) + " " + key + "=" + value + "\n";
}

// A PAX (`x` local or `g` global) or GNU (`L` long name, `K` long link)
// extension header with its payload.
inline std::string extension(char type, const std::string& payload) {
  Header h;
  h.name = type == 'L' || type == 'K' ? "././@LongLink" : "PaxHeaders/x";
  h.type = type;
  h.magic = type == 'L' || type == 'K' ? Magic::kGnu : Magic::kUstar;
  return member(h, payload);
}

inline std::string end_blocks() { return std::string(2 * kBlock, '\0'); }

// An old GNU sparse member (type `S`): the first four (offset, length)
// regions in its header, the rest in extension blocks of 21, then the
// stored bytes of every region back to back.
inline std::string old_gnu_sparse(const std::string& name, uint64_t real_size,
                                  const std::vector<std::pair<uint64_t, uint64_t>>& regions,
                                  const std::string& stored) {
  Header h;
  h.name = name;
  h.type = 'S';
  h.magic = Magic::kGnu;
  h.size = stored.size();
  for (size_t i = 0; i < regions.size() && i < 4; ++i) {
    h.raw_fields.emplace_back(386 + 24 * i, octal(regions[i].first, 11));
    h.raw_fields.emplace_back(386 + 24 * i + 12, octal(regions[i].second, 11));
  }
  if (regions.size() > 4) h.raw_fields.emplace_back(482, std::string(1, '\1'));
  h.raw_fields.emplace_back(483, octal(real_size, 11));
  std::string out = header_block(h);
  for (size_t first = 4; first < regions.size(); first += 21) {
    std::string block(kBlock, '\0');
    for (size_t i = first; i < regions.size() && i < first + 21; ++i) {
      put_field(block, 24 * (i - first), 12, octal(regions[i].first, 11));
      put_field(block, 24 * (i - first) + 12, 12, octal(regions[i].second, 11));
    }
    if (first + 21 < regions.size()) block[504] = '\1';
    out += block;
  }
  if (!stored.empty()) out += pad(stored);
  return out;
}

// An in-memory ByteSource that hands out at most `max_read` bytes per read()
// (so a test can put every buffer boundary inside a header or a payload) and
// records what the reader did with it.
class MemorySource final : public ByteSource {
 public:
  struct Log {
    size_t bytes_read = 0;
    int completes = 0;
  };

  MemorySource(std::string bytes, size_t max_read = std::numeric_limits<size_t>::max(),
               std::string url = "mem.tar")
      : bytes_(std::move(bytes)),
        max_read_(max_read),
        url_(std::move(url)),
        log_(std::make_shared<Log>()) {}

  size_t read(uint8_t* dst, size_t n) override {
    const size_t k = std::min({n, max_read_, bytes_.size() - log_->bytes_read});
    std::memcpy(dst, bytes_.data() + log_->bytes_read, k);
    log_->bytes_read += k;
    return k;
  }
  const std::string& url() const override { return url_; }
  void mark_complete() override { log_->completes += 1; }

  // Outlives the source, which the reader owns.
  std::shared_ptr<const Log> log() const { return log_; }

 private:
  std::string bytes_;
  size_t max_read_;
  std::string url_;
  std::shared_ptr<Log> log_;
};

}  // namespace chute::test

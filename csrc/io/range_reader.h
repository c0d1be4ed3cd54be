// Random access to the bytes of one shard: "read [offset, offset + size) of
// it". What indexed reading (a tar shard with an index) goes through, so
// that the same reader code serves a local file (pread, below) and a remote
// object (ranged GETs: io/remote_ranges.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace chute {

// What the caller knows a shard to be (from its index): a shard that differs
// is not the one the offsets describe. A negative value, or an empty
// version, is not checked.
struct ShardIdentity {
  int64_t size = -1;
  int64_t mtime_ns = -1;
  std::string version;  // a remote object's ETag (else modification time), as its HEAD gives it
};

class RangeReader {
 public:
  virtual ~RangeReader() = default;
  // Reads exactly [offset, offset + size) into dst. Throws kIo when the
  // system fails, kData when the shard ends before offset + size (it
  // changed after it was indexed). Called from several threads at once.
  virtual void read(uint64_t offset, size_t size, uint8_t* dst) const = 0;

  struct Span {
    uint64_t offset = 0;
    size_t size = 0;
    uint8_t* dst = nullptr;
  };
  // Fills every span, as read() fills one. A reader whose every read costs
  // a round trip (a remote object) asks for them all at once.
  virtual void read_spans(const Span* spans, size_t n) const {
    for (size_t i = 0; i < n; ++i) read(spans[i].offset, spans[i].size, spans[i].dst);
  }
  // The url as the user gave it, for errors.
  virtual const std::string& url() const = 0;
};

// A local file `path` (named `url` in errors). Throws kIo when it cannot be
// opened, kData when it is not `expected` (another size or modification
// time).
std::unique_ptr<RangeReader> open_local_range_reader(const std::string& url,
                                                     const std::string& path,
                                                     const ShardIdentity& expected);

}  // namespace chute

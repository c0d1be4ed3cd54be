// Random access to a remote object through a FetchQueue (see fetch_queue.h):
// "read these byte ranges of it, and wait for them". What readers that know
// where their bytes are (HDF5 extents and chunks, indexed tar members) use
// instead of pread when the file is an object in a store.
//
// Opening sends a HEAD and waits for it (the object's size and version). A
// read takes any number of spans at once: spans are sorted, neighbours less
// than kCoalesceGap bytes apart are merged into one range, ranges longer
// than the queue's range_bytes are split, and every range is requested at
// once, so a batch's extents cost about one round trip however many there
// are. Ranges carry If-Match with the ETag the HEAD gave, so an object
// replaced after it was opened fails (HTTP 412) instead of mixing versions.
//
// Reads are the reader's demand, not prefetch: they do not count against
// the queue's prefetch_bytes. Every wait polls the cancel flag and the
// queue's closing and is bounded as a remote source's are.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "io/range_reader.h"

namespace chute {

class FetchQueue;

class RemoteRanges {
 public:
  // Ranges closer than this are fetched as one (a request costs a round
  // trip; a short gap costs less than that to transfer).
  static constexpr uint64_t kCoalesceGap = uint64_t{64} << 10;

  struct Span {
    uint64_t offset = 0;
    size_t size = 0;
    uint8_t* dst = nullptr;
  };

  // Sends the HEAD and waits for it. Throws kIo naming the url (and HTTP
  // status) when the object cannot be read. `cancel` may be null; it must
  // outlive this object.
  RemoteRanges(std::string url, std::shared_ptr<FetchQueue> queue,
               const std::atomic<bool>* cancel = nullptr);
  ~RemoteRanges();
  RemoteRanges(const RemoteRanges&) = delete;
  RemoteRanges& operator=(const RemoteRanges&) = delete;

  const std::string& url() const { return url_; }
  uint64_t size() const { return size_; }
  // The ETag, else the modification time, as the HEAD gave it.
  const std::string& version() const { return version_; }

  // Fills every span; throws kIo naming the url, the byte range and the
  // status when a range fails for good, kData when a span reaches past the
  // object's end. Safe to call from several threads at once.
  void read(const Span* spans, size_t n) const;
  void read(uint64_t offset, size_t size, uint8_t* dst) const {
    const Span span{offset, size, dst};
    read(&span, 1);
  }

  // Ranged requests answered and their bytes, for stats and tests.
  uint64_t ranges_fetched() const { return ranges_.load(std::memory_order_relaxed); }
  uint64_t bytes_fetched() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  class Waiter;

  std::string url_;
  std::shared_ptr<FetchQueue> queue_;
  const std::atomic<bool>* cancel_;
  uint64_t size_ = 0;
  std::string etag_;  // strong ETag sent as If-Match; empty: none
  std::string version_;
  mutable std::atomic<uint64_t> ranges_{0};
  mutable std::atomic<uint64_t> bytes_{0};
};

// A remote object as a RangeReader (what indexed tar shards read through).
// Throws kIo when it cannot be read, kData when it is not the size or the
// version (ETag) that `expected` names (another object than the one
// indexed); its modification time is not checked (a store's upload time is
// not the indexed file's).
std::unique_ptr<RangeReader> open_remote_range_reader(const std::string& url,
                                                      std::shared_ptr<FetchQueue> queue,
                                                      const ShardIdentity& expected);

}  // namespace chute

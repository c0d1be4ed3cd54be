// Tar shards read by sample id through their index (tar/tar_index.h): the
// indexed engine's sample source for TarDataset. The samples a call asks
// for are sorted by shard and offset, and neighbours (less than max_gap
// apart, at most max_read together) are read with one range read into one
// buffer that their members then point into, so a batch of consecutive
// small samples costs one read. Shards are read through RangeReader
// (io/range_reader.h): local files by default, any ranged reader through
// the factory. Readers are opened on first use and at most max_open stay
// open (least recently used closed first).
//
// Every read starts at its first member's headers, and each member is
// checked against them (name, size, where its payload starts) before it is
// handed out: an index that does not describe its shard (a rewrite that kept
// the size, a wrong offset, swapped keys) fails the sample with a kData
// error instead of yielding other bytes under its key.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "io/range_reader.h"
#include "sources/indexed_sample_source.h"
#include "tar/tar_index.h"

namespace chute {

struct IndexedTarOptions {
  // Bytes between two samples that one read still spans: below it, reading
  // the gap costs less than another request.
  uint64_t max_gap = uint64_t{32} << 10;
  uint64_t max_read = uint64_t{16} << 20;  // bytes of one read (a sample larger reads alone)
  size_t max_open = 64;                    // readers kept open
};

class IndexedTarSource final : public IndexedSampleSource {
 public:
  using ReaderFactory = std::function<std::unique_ptr<RangeReader>(const TarIndex::Shard&)>;

  // Validates the index (TarIndex::validate). Without a factory, shards are
  // local files.
  IndexedTarSource(TarIndex index, IndexedTarOptions options = {}, ReaderFactory open = nullptr);

  int64_t num_samples() const override { return index_.num_samples(); }
  uint64_t payload_bytes(int64_t id) const override;
  void read(const int64_t* ids, size_t n, EncodedSample* out,
            std::optional<Error>* errors) const override;
  SampleLocation location(const EncodedSample& sample, const SampleMember* member) const override;

  const TarIndex& index() const { return index_; }
  uint64_t reads() const { return reads_.load(std::memory_order_relaxed); }
  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  struct Wanted;
  std::shared_ptr<const RangeReader> reader(size_t shard) const;
  void read_group(const Wanted* begin, const Wanted* end, EncodedSample* out,
                  std::optional<Error>* errors) const;
  // Throws kData naming shard, member and offsets when the headers before a
  // member of `sample` (read into its buffer from shard offset `from`) do
  // not name it, with its size, right before its payload.
  void check_headers(const EncodedSample& sample, int64_t id, uint64_t from) const;

  const TarIndex index_;
  const IndexedTarOptions options_;
  const ReaderFactory open_;

  mutable std::mutex mutex_;  // guards the open readers
  mutable std::list<size_t> recent_;  // shards, most recently used first
  mutable std::unordered_map<size_t, std::pair<std::shared_ptr<const RangeReader>,
                                               std::list<size_t>::iterator>> open_readers_;

  mutable std::atomic<uint64_t> reads_{0};
  mutable std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace chute

// Samples whose members lie in blocks of memory that their owner reads and
// hands over: Parquet row groups, which python/chute/datasets/parquet.py reads with
// pyarrow, their binary columns laid out as Arrow lays them out (one data
// buffer and the offsets of each row's value in it), handed over without a
// copy. Block b holds samples [block_starts[b], block_starts[b + 1]); each
// of its columns gives each sample one member (none where the row's value is
// null).
//
// The owner says a block is on its way (expect) before it submits a batch
// that reads from it, then puts it, or fails it when it cannot be read, and
// drops it once no batch in flight needs it. A batch's samples wait for
// their expected blocks on the engine's threads (wait_readable, which the
// engine's close cancels), so that a slow read delays its own batch only,
// and the consumer's wait keeps its timeout; a failed block fails each of
// its samples with its error, which the engine raises at their batch, after
// every batch before it, or skips as its error policy says. Reading a
// sample whose block is neither expected nor there fails that sample (the
// owner broke the contract) instead of waiting. A sample with one member
// points into its column's buffer in place (the buffer lives as long as a
// sample points into it); one with several gets a copy of their payloads,
// which are in different buffers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "sources/indexed_sample_source.h"

namespace chute {

struct BlockColumn {
  const uint8_t* data = nullptr;
  size_t data_size = 0;
  // rows + 1 offsets into `data`: row r's value is [offsets[r], offsets[r + 1]).
  const int64_t* offsets = nullptr;
  // One byte per row, nonzero where the row has a value; null: every row has one.
  const uint8_t* present = nullptr;
};

// Throws naming `block_name` and the column unless `columns` (one per name)
// each hold `rows` values whose offsets rise within their data buffer.
void check_block_columns(const std::string& block_name,
                         const std::vector<std::string>& column_names, int64_t rows,
                         const std::vector<BlockColumn>& columns);

class BlockSampleSource final : public IndexedSampleSource {
 public:
  // `extensions[c]` is the member extension that column c's values get (what
  // fields name); `column_names[c]` the column's name for messages;
  // `block_names[b]` names block b in messages ("file 'a.parquet', row group 3")
  // and `block_urls[b]` is the file that holds it (an error's url).
  BlockSampleSource(std::vector<std::string> extensions, std::vector<std::string> column_names,
                    std::vector<int64_t> block_starts, std::vector<std::string> block_names,
                    std::vector<std::string> block_urls);

  int64_t num_samples() const override { return block_starts_.back(); }
  // 0 for a sample whose block is not held.
  uint64_t payload_bytes(int64_t id) const override;
  void read(const int64_t* ids, size_t n, EncodedSample* out,
            std::optional<Error>* errors) const override;
  // Returns once every expected block of the samples is put or failed.
  void wait_readable(const int64_t* ids, size_t n, const std::atomic<bool>& cancel) const override;
  SampleLocation location(const EncodedSample& sample, const SampleMember* member) const override;

  size_t num_blocks() const { return block_names_.size(); }
  int64_t block_rows(size_t block) const;
  // Block `block` is being read: its samples wait for it (wait_readable)
  // until it is put or failed. Leaves a block already put or failed as it is.
  void expect(size_t block);
  // Block `block`'s columns (one per extension, in order); `owner` keeps their
  // memory alive and is released when the block is dropped and no sample
  // points into it any more. Replaces what the block held.
  void put(size_t block, std::vector<BlockColumn> columns, std::shared_ptr<void> owner);
  // Block `block` cannot be read: each of its samples fails with `error`
  // (which names the block) until it is dropped or put.
  void fail(size_t block, const Error& error);
  // Forgets the block: held, failed or expected.
  void drop(size_t block);
  size_t blocks_held() const;
  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  class ColumnStorage;
  struct Block {
    std::vector<BlockColumn> columns;
    std::vector<std::shared_ptr<const ColumnStorage>> storage;  // one per column
  };
  // What the owner said of one block.
  struct Slot {
    std::shared_ptr<const Block> held;  // put
    std::optional<Error> failure;       // failed
    bool expected = false;              // on its way: neither put nor failed yet
  };
  size_t block_of(int64_t id) const;
  std::shared_ptr<const Block> held(size_t block) const;

  const std::vector<std::string> extensions_;
  const std::vector<std::string> column_names_;
  const std::vector<int64_t> block_starts_;
  const std::vector<std::string> block_names_;
  const std::vector<std::string> block_urls_;

  mutable std::mutex mutex_;  // guards slots_
  mutable std::condition_variable settled_;  // a block was put, failed or dropped
  std::vector<Slot> slots_;
  mutable std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace chute

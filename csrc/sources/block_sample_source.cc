#include "sources/block_sample_source.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <utility>

namespace chute {

// One column's data buffer of a block, which samples read in place point into.
class BlockSampleSource::ColumnStorage final : public InPlaceStorage {
 public:
  ColumnStorage(const uint8_t* data, std::shared_ptr<void> owner)
      : InPlaceStorage(data), owner_(std::move(owner)) {}

  // Memory the owner holds: nothing under it can go away.
  bool refresh() const override { return false; }
  bool lost(const EncodedSample&) const override { return false; }
  Error lost_error(const EncodedSample& sample) const override {
    return Error(ErrorKind::kData, "sample '" + sample.key + "' was held in memory", __FILE__,
                 __LINE__);
  }
  void release(uint64_t, uint64_t) const override {}

 private:
  std::shared_ptr<void> owner_;
};

void check_block_columns(const std::string& block_name,
                         const std::vector<std::string>& column_names, int64_t rows,
                         const std::vector<BlockColumn>& columns) {
  CHUTE_CHECK(columns.size() == column_names.size(), kUsage,
              block_name << ": " << columns.size() << " columns given, " << column_names.size()
                         << " expected");
  for (size_t c = 0; c < columns.size(); ++c) {
    const BlockColumn& col = columns[c];
    CHUTE_CHECK(col.offsets != nullptr && (rows == 0 || col.offsets[0] >= 0), kUsage,
                block_name << ", column '" << column_names[c] << "': no offsets");
    for (int64_t r = 0; r < rows; ++r) {
      CHUTE_CHECK(col.offsets[r + 1] >= col.offsets[r], kData,
                  block_name << ", column '" << column_names[c] << "': value of row " << r
                             << " ends before it starts");
    }
    CHUTE_CHECK(rows == 0 || static_cast<uint64_t>(col.offsets[rows]) <= col.data_size, kData,
                block_name << ", column '" << column_names[c] << "': values end at byte "
                           << col.offsets[rows] << " of a buffer of " << col.data_size
                           << " bytes");
  }
}

BlockSampleSource::BlockSampleSource(std::vector<std::string> extensions,
                                     std::vector<std::string> column_names,
                                     std::vector<int64_t> block_starts,
                                     std::vector<std::string> block_names,
                                     std::vector<std::string> block_urls)
    : extensions_(std::move(extensions)),
      column_names_(std::move(column_names)),
      block_starts_(std::move(block_starts)),
      block_names_(std::move(block_names)),
      block_urls_(std::move(block_urls)) {
  CHUTE_CHECK(column_names_.size() == extensions_.size(), kUsage,
              "block source: " << extensions_.size() << " extensions but " << column_names_.size()
                               << " column names");
  CHUTE_CHECK(!block_starts_.empty() && block_starts_.front() == 0 &&
                  block_starts_.size() == block_names_.size() + 1,
              kUsage,
              "block source: block starts must begin at 0 and have one more entry than the "
                  << block_names_.size() << " block names");
  CHUTE_CHECK(block_urls_.size() == block_names_.size(), kUsage,
              "block source: " << block_names_.size() << " block names but "
                               << block_urls_.size() << " block urls");
  CHUTE_CHECK(std::is_sorted(block_starts_.begin(), block_starts_.end()), kUsage,
              "block source: block starts must not decrease");
  slots_.resize(block_names_.size());
}

int64_t BlockSampleSource::block_rows(size_t block) const {
  CHUTE_CHECK(block < block_names_.size(), kUsage,
              "block " << block << " is out of range (" << block_names_.size() << " blocks)");
  return block_starts_[block + 1] - block_starts_[block];
}

size_t BlockSampleSource::block_of(int64_t id) const {
  const auto it = std::upper_bound(block_starts_.begin(), block_starts_.end(), id);
  return static_cast<size_t>(it - block_starts_.begin()) - 1;
}

std::shared_ptr<const BlockSampleSource::Block> BlockSampleSource::held(size_t block) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slots_[block].held;
}

void BlockSampleSource::expect(size_t block) {
  block_rows(block);  // checks the range
  std::lock_guard<std::mutex> lock(mutex_);
  Slot& slot = slots_[block];
  if (slot.held == nullptr && !slot.failure) slot.expected = true;
}

void BlockSampleSource::put(size_t block, std::vector<BlockColumn> columns,
                            std::shared_ptr<void> owner) {
  check_block_columns(block_names_[block], column_names_, block_rows(block), columns);
  auto held = std::make_shared<Block>();
  for (const BlockColumn& col : columns) {
    held->storage.push_back(std::make_shared<const ColumnStorage>(col.data, owner));
  }
  held->columns = std::move(columns);
  std::shared_ptr<const Block> replaced;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Slot& slot = slots_[block];
    replaced = std::move(slot.held);
    slot = Slot{std::move(held), std::nullopt, false};
  }
  settled_.notify_all();
}

void BlockSampleSource::fail(size_t block, const Error& error) {
  block_rows(block);  // checks the range
  std::shared_ptr<const Block> replaced;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Slot& slot = slots_[block];
    replaced = std::move(slot.held);
    slot = Slot{nullptr, error, false};
  }
  settled_.notify_all();
}

void BlockSampleSource::drop(size_t block) {
  block_rows(block);  // checks the range
  std::shared_ptr<const Block> gone;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    gone = std::move(slots_[block].held);
    slots_[block] = Slot{};
  }
  settled_.notify_all();
}

size_t BlockSampleSource::blocks_held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<size_t>(std::count_if(slots_.begin(), slots_.end(),
                                           [](const Slot& s) { return s.held != nullptr; }));
}

void BlockSampleSource::wait_readable(const int64_t* ids, size_t n,
                                      const std::atomic<bool>& cancel) const {
  std::unique_lock<std::mutex> lock(mutex_);
  size_t current = SIZE_MAX;
  for (size_t r = 0; r < n; ++r) {
    const size_t b = block_of(ids[r]);
    if (b == current) continue;
    current = b;
    // The engine's close sets `cancel` without a word to this source: the
    // wait looks at it every few milliseconds.
    while (slots_[b].expected) {
      CHUTE_CHECK(!cancel.load(std::memory_order_relaxed), kIo,
                  block_names_[b] << ": the engine closed while the block was read");
      settled_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
}

uint64_t BlockSampleSource::payload_bytes(int64_t id) const {
  const size_t b = block_of(id);
  const std::shared_ptr<const Block> block = held(b);
  if (block == nullptr) return 0;
  const auto row = static_cast<size_t>(id - block_starts_[b]);
  uint64_t bytes = 0;
  for (const BlockColumn& col : block->columns) {
    bytes += static_cast<uint64_t>(col.offsets[row + 1] - col.offsets[row]);
  }
  return bytes;
}

void BlockSampleSource::read(const int64_t* ids, size_t n, EncodedSample* out,
                             std::optional<Error>* errors) const {
  std::shared_ptr<const Block> block;
  std::optional<Error> failure;
  size_t current = SIZE_MAX;
  std::vector<size_t> columns;  // the column of each member of the sample at hand
  for (size_t r = 0; r < n; ++r) {
    const size_t b = block_of(ids[r]);
    if (b != current) {
      std::lock_guard<std::mutex> lock(mutex_);
      block = slots_[b].held;
      failure = slots_[b].failure;
      current = b;
    }
    EncodedSample& s = out[r];
    const auto row = static_cast<size_t>(ids[r] - block_starts_[b]);
    s.key = std::to_string(ids[r]);
    s.source_index = static_cast<uint32_t>(b);
    s.offset = row;
    s.end_offset = row + 1;
    s.members.clear();
    s.nulls.clear();
    s.data.clear();
    s.in_place = nullptr;
    s.payload_bytes = 0;
    if (failure) {
      errors[r] = failure;
      continue;
    }
    if (block == nullptr) {
      errors[r] = Error(ErrorKind::kUsage,
                        location(s, nullptr).text + ": its block was not read ahead of the batch",
                        __FILE__, __LINE__);
      continue;
    }
    columns.clear();
    for (size_t c = 0; c < block->columns.size(); ++c) {
      const BlockColumn& col = block->columns[c];
      SampleMember m;
      m.extension = extensions_[c];
      m.name = column_names_[c];
      m.offset = row;
      if (col.present != nullptr && col.present[row] == 0) {
        s.nulls.push_back(std::move(m));
        continue;
      }
      m.data_offset = static_cast<uint64_t>(col.offsets[row]);
      m.data_begin = static_cast<size_t>(col.offsets[row]);
      m.data_size = static_cast<size_t>(col.offsets[row + 1] - col.offsets[row]);
      s.payload_bytes += m.data_size;
      s.members.push_back(std::move(m));
      columns.push_back(c);
    }
    if (s.members.size() == 1) {
      s.in_place = block->storage[columns[0]];
    } else {
      // Payloads of several buffers: copied back to back.
      s.data.reserve(s.payload_bytes);
      for (size_t k = 0; k < s.members.size(); ++k) {
        SampleMember& m = s.members[k];
        const uint8_t* from = block->columns[columns[k]].data + m.data_begin;
        m.data_begin = s.data.size();
        s.data.insert(s.data.end(), from, from + m.data_size);
      }
    }
    bytes_read_.fetch_add(s.payload_bytes, std::memory_order_relaxed);
  }
}

SampleLocation BlockSampleSource::location(const EncodedSample& sample,
                                           const SampleMember* member) const {
  std::ostringstream os;
  os << block_names_[sample.source_index] << ", row " << sample.offset << " (sample "
     << sample.key << ")";
  if (member != nullptr) os << ", column '" << member->name << "'";
  return {os.str(),
          {block_urls_[sample.source_index], member != nullptr ? member->name : "", sample.key}};
}

}  // namespace chute

// Stream shards whose samples lie in blocks of memory that their owner reads
// when a shard is opened: Parquet row groups, which python/chute/wds/
// parquet_stream.py reads with pyarrow, one row group per stream url. The
// engine opens its next shards ahead of need (parse_ahead); each open posts
// a request, and the owner's readers take requests in that order
// (next_request), read the block and hand it over (put) or report why it
// cannot be read (fail). A source waits for its block, then yields one
// sample per row, each column giving the sample one member (none where the
// row's value is null); it honours the engine's cancel flag while it waits.
// Native threads never call the owner: the owner pulls requests.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "sources/block_sample_source.h"
#include "sources/sample_source.h"

namespace chute {

class BlockFeed final : public SampleSourceFactory {
 public:
  // One block per url: `urls[b]` names block b in a plan, `rows[b]` its row
  // count, `names[b]` it in messages ("file 'a.parquet', row group 3") and
  // `first_keys[b]` the key of its first row (keys count on from there);
  // `files[b]` is the file that holds it (an error's url).
  // `extensions[c]` is the member extension column c's values get;
  // `column_names[c]` the column's name for messages.
  BlockFeed(std::vector<std::string> extensions, std::vector<std::string> column_names,
            std::vector<std::string> urls, std::vector<int64_t> rows,
            std::vector<std::string> names, std::vector<int64_t> first_keys,
            std::vector<std::string> files);
  ~BlockFeed() override;

  std::unique_ptr<SampleSource> open(const std::string& url, uint32_t index,
                                     const SourceOpenOptions& options) const override;
  SampleLocation location(const std::string& url, const EncodedSample& sample,
                          const SampleMember* member) const override;

  struct Request {
    uint64_t ticket = 0;
    size_t block = 0;
  };
  // The oldest request not yet taken; none when `timeout_s` passes first
  // or the feed is closed. Without a timeout it waits for one or the other
  // (an idle reader then costs nothing: close() is what ends its wait).
  std::optional<Request> next_request(std::optional<double> timeout_s = std::nullopt) const;
  // Request `ticket`'s block: its columns (one per extension, rows as the
  // block has) and `owner`, which keeps their memory alive until no sample
  // needs it. A ticket whose source is gone is ignored. Columns that do not
  // fit the block throw, and their source throws the same.
  void put(uint64_t ticket, std::vector<BlockColumn> columns, std::shared_ptr<void> owner) const;
  // Request `ticket`'s block cannot be read: its source throws `error`.
  void fail(uint64_t ticket, const Error& error) const;
  // Wakes every next_request() and makes later ones return none.
  void close() const;

  size_t num_blocks() const;
  int64_t block_rows(size_t block) const;
  // Payload bytes the sources have handed out.
  uint64_t bytes_read() const;

  struct Shared;   // the layout and the requests, shared with the sources
  struct Pending;  // one opened source's block, as it arrives

 private:
  class Source;
  std::shared_ptr<Shared> shared_;
};

}  // namespace chute

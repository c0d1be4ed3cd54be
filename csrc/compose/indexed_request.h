// What an index-driven dataset asks for, as the bindings convert it from
// Python, and the sources built from it: tar shards read by sample id
// through their index, samples in blocks of memory their owner hands over
// (Parquet row groups), HDF5 datasets, arrays in memory and the fields of
// packed token sequences read by row. Which reader opens each tar shard is
// the catalog's choice (catalog.h). The bindings build every index-driven
// source here; a new one is a request and a compose_ function beside these.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "hdf5/h5_layout.h"
#include "hdf5/h5_row_source.h"
#include "sources/block_sample_source.h"
#include "sources/memory_row_source.h"
#include "tar/indexed_tar_source.h"
#include "tar/tar_index.h"
#include "tokens/token_packer.h"

namespace chute {

class FetchQueue;

struct TarIndexRequest {
  TarIndex index;  // validated by the source
  IndexedTarOptions options;
  std::shared_ptr<FetchQueue> remote;  // null: every shard is a local file
};

std::shared_ptr<IndexedTarSource> compose_tar_index_source(TarIndexRequest request);

// Samples whose members lie in blocks their owner puts and drops (see
// BlockSampleSource): one member per column, `extensions[c]` naming column
// c's members, `column_names[c]` and `block_names[b]` naming them in
// messages, `block_urls[b]` the file of block b; block b holds samples
// [block_starts[b], block_starts[b + 1]).
struct BlockSamplesRequest {
  std::vector<std::string> extensions;
  std::vector<std::string> column_names;
  std::vector<int64_t> block_starts;
  std::vector<std::string> block_names;
  std::vector<std::string> block_urls;
};

std::shared_ptr<BlockSampleSource> compose_block_samples(BlockSamplesRequest request);

// One HDF5 dataset over `layouts` (one per file), read through `context`'s
// file pool, chunk cache and remote queue.
std::shared_ptr<H5RowSource> compose_h5_rows(std::shared_ptr<H5Context> context,
                                             std::string name, std::vector<H5Layout> layouts);

// Rows of memory someone else owns (see MemoryRowSource).
struct MemoryRowsRequest {
  std::string name;
  const uint8_t* data = nullptr;
  int64_t num_rows = 0;
  int64_t row_stride = 0;  // bytes between consecutive rows
  DType dtype = DType::kU8;
  std::vector<int64_t> row_shape;
  std::shared_ptr<void> owner;  // released when the source dies
  std::string element_descr;    // see RowSource::element_descr
};

std::shared_ptr<MemoryRowSource> compose_memory_rows(MemoryRowsRequest request);

// The rows of one field of `packer`'s sequences, by the field's name:
// 'input_ids', 'labels', 'position_ids', or 'window' (windows packing only:
// seq_len + 1 tokens, input_ids and labels in one row). kUsage for another
// name, or for 'window' when packing documents.
std::shared_ptr<RowSource> compose_token_field(std::shared_ptr<const TokenPacker> packer,
                                               const std::string& field);

}  // namespace chute

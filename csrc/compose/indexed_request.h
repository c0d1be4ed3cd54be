// What an index-driven dataset asks for, as the bindings convert it from
// Python, and the sources built from it: tar shards read by sample id
// through their index, HDF5 datasets and arrays in memory read by row.
// Which reader opens each tar shard is the catalog's choice (catalog.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "hdf5/h5_layout.h"
#include "hdf5/h5_row_source.h"
#include "pipeline/memory_row_source.h"
#include "tar/indexed_tar_source.h"
#include "tar/tar_index.h"

namespace chute {

class FetchQueue;

struct TarIndexRequest {
  TarIndex index;  // validated by the source
  IndexedTarOptions options;
  std::shared_ptr<FetchQueue> remote;  // null: every shard is a local file
};

std::shared_ptr<IndexedTarSource> compose_tar_index_source(TarIndexRequest request);

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

}  // namespace chute

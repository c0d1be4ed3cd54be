// How one HDF5 dataset in one file is stored, as h5py described it at open.
// The engine never parses HDF5 metadata itself: Python walks the file once
// (h5py/libhdf5 know every format version), and the hot path only needs byte
// addresses, sizes and the filter pipeline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace chute {

enum class H5Filter : uint8_t { kDeflate, kShuffle, kFletcher32 };

struct H5ChunkInfo {
  std::vector<int64_t> offset;  // element coordinates of the chunk's first element
  uint64_t address = 0;         // byte offset in the file
  uint64_t size = 0;            // stored (filtered) bytes
  uint32_t filter_mask = 0;     // bit i set: filter i was skipped for this chunk
};

struct H5Layout {
  std::string path;     // file
  std::string dataset;  // path inside the file
  DType dtype = DType::kU8;
  bool byteswap = false;            // file stores elements big-endian
  std::vector<int64_t> row_shape;   // dims after the first
  int64_t num_rows = 0;

  enum class Kind : uint8_t { kContiguous, kChunked, kUnallocated } kind = Kind::kContiguous;
  uint64_t offset = 0;  // kContiguous: byte offset of row 0

  // kChunked
  std::vector<int64_t> chunk_shape;     // full rank
  std::vector<H5Filter> filters;        // in write order; undone in reverse
  std::vector<H5ChunkInfo> chunks;      // allocated chunks only

  // One element in the file's byte order; unallocated storage reads as this.
  std::vector<uint8_t> fill_value;

  // The file as it was when described: a later mismatch means it changed.
  // A remote object (`path` is its url) has a size and a version (its ETag,
  // else its modification time) instead of an mtime and an inode.
  uint64_t file_size = 0;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  std::string version;
};

}  // namespace chute

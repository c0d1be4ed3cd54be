// Rows of one HDF5 dataset, concatenated over many files in file order, read
// from the layouts h5py described (see h5_layout.h): contiguous rows copied
// out of a mapping of the file (pread where the kernel refuses one), chunks
// read with pread and decoded through the shared chunk cache.
//
// A file whose path is a remote url (an object in a store, see
// hdf5/file_pool.h) is read with ranged requests of exactly the extents a
// call needs: the runs of rows, or the raw bytes of the chunks (or cached
// blocks) it touches that the chunk cache does not hold, all requested at
// once (io/remote_ranges.h merges neighbours); cached chunks cost nothing.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hdf5/chunk_cache.h"
#include "hdf5/file_pool.h"
#include "hdf5/h5_layout.h"
#include "io/mapped_region.h"
#include "sources/row_source.h"

namespace chute {

// What the datasets of one H5Dataset share: the open descriptors and the
// decompressed-chunk cache, both bounded by the user's settings.
class H5Context {
 public:
  // map_files: contiguous datasets are read through a memory mapping of the
  // file (io/mapped_region.h) instead of pread through cached blocks.
  H5Context(size_t chunk_cache_bytes, size_t max_open_files, bool map_files = true)
      : files_(max_open_files), cache_(chunk_cache_bytes), map_files_(map_files) {}
  bool map_files() const { return map_files_; }
  // Remote urls among the layouts' paths are read through `queue`.
  void set_remote(std::shared_ptr<FetchQueue> queue) { files_.set_remote(std::move(queue)); }
  h5::FilePool& files() { return files_; }
  h5::ChunkCache& cache() { return cache_; }
  uint64_t new_source_id() { return next_source_id_.fetch_add(1); }

  // Unfiltered datasets (contiguous, or plain chunks) may be served from the
  // chunk cache only while all of them together fit in half of it: random
  // rows of a dataset the cache cannot hold would each pull a whole block
  // from the file and evict the decompressed chunks that need the cache
  // more. True when `bytes` more fit, and then they count until released.
  bool reserve_plain_share(uint64_t bytes);
  void release_plain_share(uint64_t bytes);

 private:
  h5::FilePool files_;
  h5::ChunkCache cache_;
  const bool map_files_;
  std::atomic<uint64_t> next_source_id_{1};
  std::atomic<uint64_t> plain_reserved_{0};
};

class H5RowSource : public RowSource {
 public:
  // All layouts must describe the same dataset shape after the first axis and
  // the same element type (byte order may differ per file). Throws kUsage or
  // kData for an inconsistent description.
  H5RowSource(std::shared_ptr<H5Context> context, std::string name, std::vector<H5Layout> files);
  ~H5RowSource() override;
  H5RowSource(const H5RowSource&) = delete;
  H5RowSource& operator=(const H5RowSource&) = delete;

  DType dtype() const override { return dtype_; }
  const std::vector<int64_t>& row_shape() const override { return row_shape_; }
  int64_t num_rows() const override { return starts_.back(); }
  const std::string& name() const override { return name_; }
  void read_rows(const int64_t* rows, size_t n, uint8_t* out) override;
  uint64_t bytes_read() const override { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  struct File {
    H5Layout layout;
    uint32_t file_id = 0;
    std::vector<int64_t> grid;      // chunks along each dimension (chunked only)
    std::vector<int32_t> chunk_at;  // linear grid position -> index in layout.chunks, -1 unallocated
    int64_t chunks_per_row = 1;     // grid positions a row crosses (product of grid[1..])
    size_t chunk_bytes = 0;         // one decoded chunk
    size_t chunk_row_bytes = 0;     // one first-axis slice of a chunk
    bool full_rows = false;         // chunks span whole rows: a row is one slice of one chunk
    bool direct = false;            // and no filter: rows are pread straight from the file
    bool blocked = false;           // contiguous, read through the cache in fixed blocks
    bool fill_zero = true;
    bool remote = false;            // `layout.path` is a remote url
    // Contiguous data mapped (see io/mapped_region.h); null when the kernel
    // refused the mapping, and rows are then read with pread.
    std::unique_ptr<MappedRegion> mapping;
  };
  // A row to read: its global index and its slot in the output.
  using Want = std::pair<int64_t, uint32_t>;
  // Raw bytes of a remote file's chunks (or blocks) fetched for one call,
  // by chunk index (or block number).
  using Prefetched = std::unordered_map<uint64_t, std::vector<uint8_t>>;

  void read_file_rows(size_t fi, const Want* wants, size_t m, uint8_t* out);
  void map_contiguous_files();
  // File offset of a local row where rows are plain bytes (contiguous, or
  // direct chunks); UINT64_MAX when the row's storage is unallocated.
  uint64_t row_offset(const File& f, int64_t local) const;
  void read_mapped_rows(size_t fi, const h5::OpenFile& file, const Want* wants, size_t m,
                        uint8_t* out);
  void read_plain_rows(size_t fi, const h5::OpenFile& file, const Want* wants, size_t m,
                       uint8_t* out);
  void read_blocked_rows(size_t fi, const h5::OpenFile& file, const Want* wants, size_t m,
                         uint8_t* out);
  h5::ChunkCache::Data load_block(size_t fi, uint64_t block, const h5::OpenFile& file,
                                  int64_t row, Prefetched& fetched);
  // Routes small-row unfiltered files through the cache when it can hold them.
  void plan_plain_caching();
  void read_chunked_rows(size_t fi, const h5::OpenFile* file, const Want* wants, size_t m,
                         uint8_t* out);
  h5::ChunkCache::Data load_chunk(size_t fi, int32_t ci, const h5::OpenFile& file, int64_t row,
                                  Prefetched& fetched);
  // Whether chunk (or block) `unit` of file `fi` is in the chunk cache.
  bool cached(size_t fi, uint64_t unit) const;
  // Fetches every (unit, (offset, size)) of a remote file with one read.
  Prefetched prefetch(const h5::OpenFile& file,
                      const std::vector<std::pair<uint64_t, std::pair<uint64_t, size_t>>>& units) const;
  std::vector<uint8_t> decode_chunk(const File& f, int32_t ci, std::vector<uint8_t> raw,
                                    int64_t row) const;
  // Copies the part of local chunk-row `rr` of a chunk at grid position g
  // (dims 1..) into `row_out`; a null `chunk` writes the fill value.
  void copy_piece(const File& f, const uint8_t* chunk, int64_t rr, const int64_t* g,
                  uint8_t* row_out) const;
  void fill_row(const File& f, uint8_t* row_out) const;
  std::string chunk_where(const File& f, int32_t ci, int64_t row) const;

  std::shared_ptr<H5Context> context_;
  std::string name_;
  uint64_t source_id_;
  DType dtype_ = DType::kU8;
  size_t elem_size_ = 1;
  std::vector<int64_t> row_shape_;
  size_t row_bytes_ = 0;
  std::vector<File> files_;
  std::vector<int64_t> starts_;  // starts_[i]: global index of file i's row 0; back(): total
  std::atomic<uint64_t> bytes_read_{0};
  uint64_t plain_reserved_ = 0;  // this source's claim on the context's plain share
};

}  // namespace chute

#include "hdf5/h5_row_source.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "hdf5/h5_filters.h"
#include "io/remote_source.h"

namespace chute {

namespace {

constexpr uint64_t kUnallocated = std::numeric_limits<uint64_t>::max();
// A grid index bigger than this would need a sparse map; such datasets are
// routed to the h5py path by the Python side (they are also pathological:
// more than 64 Mi chunks).
constexpr int64_t kMaxGrid = int64_t{1} << 26;

// Contiguous storage is cached as fixed blocks of this many bytes, counted
// from the dataset's first byte. A random row costs one pread syscall, far
// more than a memcpy from a cached block, so once a block has been touched
// every row in it is nearly free. 64 KiB keeps one block read cheap on first
// touch and stays below glibc's mmap threshold, so blocks come from the heap
// rather than from mmap/munmap.
constexpr uint64_t kBlockBytes = uint64_t{64} << 10;
// Only rows this small go through blocks (or plain chunks): for bigger rows
// one pread already moves enough bytes to hide the syscall, and an extra
// copy through the cache would cost more than it saves.
constexpr size_t kMaxCachedRowBytes = size_t{4} << 10;
// Plain chunks larger than this keep the direct per-row reads: a first touch
// would read far more than the rows asked for.
constexpr size_t kMaxCachedPlainChunkBytes = size_t{4} << 20;

void byteswap_inplace(uint8_t* p, size_t bytes, size_t elem) {
  for (size_t i = 0; i + elem <= bytes; i += elem) std::reverse(p + i, p + i + elem);
}

}  // namespace

bool H5Context::reserve_plain_share(uint64_t bytes) {
  const uint64_t limit = cache_.capacity() / 2;
  uint64_t cur = plain_reserved_.load();
  do {
    if (bytes > limit || cur > limit - bytes) return false;
  } while (!plain_reserved_.compare_exchange_weak(cur, cur + bytes));
  return true;
}

void H5Context::release_plain_share(uint64_t bytes) { plain_reserved_.fetch_sub(bytes); }

H5RowSource::~H5RowSource() {
  if (plain_reserved_ > 0) context_->release_plain_share(plain_reserved_);
}

void H5RowSource::plan_plain_caching() {
  if (row_bytes_ == 0 || row_bytes_ > kMaxCachedRowBytes) return;
  uint64_t bytes = 0;
  std::vector<size_t> chosen;
  for (size_t fi = 0; fi < files_.size(); ++fi) {
    const File& f = files_[fi];
    const H5Layout& l = f.layout;
    if (f.mapping != nullptr) continue;  // read from the page cache through the mapping
    if (l.kind == H5Layout::Kind::kContiguous) {
      bytes += static_cast<uint64_t>(l.num_rows) * row_bytes_;
    } else if (f.direct && f.chunk_bytes <= kMaxCachedPlainChunkBytes) {
      bytes += static_cast<uint64_t>(l.chunks.size()) * f.chunk_bytes;
    } else {
      continue;
    }
    chosen.push_back(fi);
  }
  // All files or none: the decision is made once, while nothing is cached.
  if (chosen.empty() || bytes == 0 || !context_->reserve_plain_share(bytes)) return;
  plain_reserved_ = bytes;
  for (size_t fi : chosen) {
    File& f = files_[fi];
    if (f.layout.kind == H5Layout::Kind::kContiguous) {
      f.blocked = true;
    } else {
      f.direct = false;  // plain chunks are then loaded whole through the cache
    }
  }
}

H5RowSource::H5RowSource(std::shared_ptr<H5Context> context, std::string name,
                         std::vector<H5Layout> layouts)
    : context_(std::move(context)), name_(std::move(name)) {
  CHUTE_CHECK(context_ != nullptr, kUsage, "H5RowSource '" << name_ << "' needs a context");
  CHUTE_CHECK(!layouts.empty(), kUsage, "H5RowSource '" << name_ << "' has no files");
  source_id_ = context_->new_source_id();
  dtype_ = layouts[0].dtype;
  elem_size_ = dtype_size(dtype_);
  row_shape_ = layouts[0].row_shape;
  row_bytes_ = row_bytes();
  starts_.push_back(0);
  for (H5Layout& layout : layouts) {
    const std::string& path = layout.path;
    CHUTE_CHECK(layout.dtype == dtype_ && layout.row_shape == row_shape_, kUsage,
                "'" << path << "' dataset '" << layout.dataset << "' has a different dtype or row shape than '"
                    << layouts[0].path << "'");
    CHUTE_CHECK(layout.num_rows >= 0, kUsage, "'" << path << "': negative row count");
    File f;
    f.file_id = context_->files().register_file(
        path, h5::FileIdentity{layout.file_size, layout.mtime_ns, layout.inode, layout.version});
    f.remote = is_remote_url(path);
    if (layout.fill_value.empty()) layout.fill_value.assign(elem_size_, 0);
    CHUTE_CHECK(layout.fill_value.size() == elem_size_, kUsage,
                "'" << path << "' dataset '" << layout.dataset << "': fill value has "
                    << layout.fill_value.size() << " bytes, expected " << elem_size_);
    f.fill_zero = std::all_of(layout.fill_value.begin(), layout.fill_value.end(),
                              [](uint8_t b) { return b == 0; });
    if (layout.kind == H5Layout::Kind::kChunked) {
      const size_t rank = row_shape_.size() + 1;
      CHUTE_CHECK(layout.chunk_shape.size() == rank, kUsage,
                  "'" << path << "' dataset '" << layout.dataset << "': chunk rank "
                      << layout.chunk_shape.size() << " != dataset rank " << rank);
      int64_t grid_size = 1;
      f.chunk_bytes = elem_size_;
      f.full_rows = true;
      for (size_t d = 0; d < rank; ++d) {
        const int64_t c = layout.chunk_shape[d];
        const int64_t extent = d == 0 ? layout.num_rows : row_shape_[d - 1];
        CHUTE_CHECK(c > 0, kUsage, "'" << path << "': chunk dimension " << d << " is " << c);
        const int64_t g = extent == 0 ? 0 : (extent + c - 1) / c;
        f.grid.push_back(g);
        grid_size *= std::max<int64_t>(g, 1);
        CHUTE_CHECK(grid_size <= kMaxGrid, kUsage,
                    "'" << path << "' dataset '" << layout.dataset << "' has too many chunks");
        f.chunk_bytes *= static_cast<size_t>(c);
        if (d > 0) {
          f.chunks_per_row *= g;
          if (c != extent) f.full_rows = false;
        }
      }
      f.chunk_row_bytes = f.chunk_bytes / static_cast<size_t>(layout.chunk_shape[0]);
      f.chunk_at.assign(static_cast<size_t>(grid_size), -1);
      CHUTE_CHECK(layout.chunks.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                  kUsage, "'" << path << "': too many chunks");
      bool all_plain = true;
      for (size_t ci = 0; ci < layout.chunks.size(); ++ci) {
        const H5ChunkInfo& c = layout.chunks[ci];
        CHUTE_CHECK(c.offset.size() == rank, kData,
                    "'" << path << "' dataset '" << layout.dataset << "' chunk " << ci
                        << " has a malformed offset");
        int64_t lin = 0;
        for (size_t d = 0; d < rank; ++d) {
          const int64_t cs = layout.chunk_shape[d];
          CHUTE_CHECK(c.offset[d] >= 0 && c.offset[d] % cs == 0 && c.offset[d] / cs < f.grid[d],
                      kData,
                      "'" << path << "' dataset '" << layout.dataset << "' chunk " << ci
                          << " at byte offset " << c.address << " lies outside the dataset");
          lin = lin * f.grid[d] + c.offset[d] / cs;
        }
        f.chunk_at[static_cast<size_t>(lin)] = static_cast<int32_t>(ci);
        const uint32_t all_skipped = layout.filters.empty()
                                         ? 0
                                         : static_cast<uint32_t>((uint64_t{1} << layout.filters.size()) - 1);
        if ((c.filter_mask & all_skipped) != all_skipped) all_plain = false;
        if (all_plain) {
          CHUTE_CHECK(c.size == f.chunk_bytes, kData,
                      "'" << path << "' dataset '" << layout.dataset << "' chunk " << ci
                          << " at byte offset " << c.address << " stores " << c.size
                          << " bytes, expected " << f.chunk_bytes);
        }
      }
      f.direct = f.full_rows && all_plain;
    }
    starts_.push_back(starts_.back() + layout.num_rows);
    f.layout = std::move(layout);
    files_.push_back(std::move(f));
  }
  map_contiguous_files();
  plan_plain_caching();
}

void H5RowSource::map_contiguous_files() {
  if (!context_->map_files()) return;
  for (File& f : files_) {
    const H5Layout& l = f.layout;
    if (l.kind != H5Layout::Kind::kContiguous || l.num_rows == 0 || row_bytes_ == 0 || f.remote) {
      continue;
    }
    const uint64_t bytes = static_cast<uint64_t>(l.num_rows) * row_bytes_;
    // A layout that claims bytes past the end of the file is left to the
    // pread path, whose short-read error names the offset.
    if (l.offset + bytes > l.file_size) continue;
    try {
      std::shared_ptr<h5::OpenFile> file = context_->files().acquire(f.file_id);
      f.mapping = std::make_unique<MappedRegion>(file->fd(), l.offset, static_cast<size_t>(bytes),
                                                 file->path());
    } catch (const Error&) {
      f.mapping.reset();  // e.g. a file system without mmap: pread still works
    }
  }
}

void H5RowSource::read_rows(const int64_t* rows, size_t n, uint8_t* out) {
  if (n == 0) return;
  // Rows sorted by index: each file is visited once, adjacent rows coalesce
  // into one pread, and rows of one chunk are served by one decompression.
  thread_local std::vector<Want> wants;
  wants.resize(n);
  for (size_t i = 0; i < n; ++i) wants[i] = Want(rows[i], static_cast<uint32_t>(i));
  if (!std::is_sorted(wants.begin(), wants.end())) std::sort(wants.begin(), wants.end());
  size_t i = 0;
  while (i < n) {
    const int64_t row = wants[i].first;
    const size_t fi = static_cast<size_t>(
        std::upper_bound(starts_.begin(), starts_.end(), row) - starts_.begin() - 1);
    const int64_t end = starts_[fi + 1];
    size_t j = i;
    while (j < n && wants[j].first < end) ++j;
    read_file_rows(fi, wants.data() + i, j - i, out);
    i = j;
  }
}

uint64_t H5RowSource::row_offset(const File& f, int64_t local) const {
  const H5Layout& l = f.layout;
  if (l.kind == H5Layout::Kind::kContiguous) {
    return l.offset + static_cast<uint64_t>(local) * row_bytes_;
  }
  const int64_t c0 = local / l.chunk_shape[0];
  const int32_t ci = f.chunk_at[static_cast<size_t>(c0)];
  if (ci < 0) return kUnallocated;
  return l.chunks[static_cast<size_t>(ci)].address +
         static_cast<uint64_t>(local - c0 * l.chunk_shape[0]) * f.chunk_row_bytes;
}

void H5RowSource::read_file_rows(size_t fi, const Want* wants, size_t m, uint8_t* out) {
  File& f = files_[fi];
  const H5Layout& l = f.layout;
  if (l.kind == H5Layout::Kind::kUnallocated) {
    for (size_t k = 0; k < m; ++k) fill_row(f, out + wants[k].second * row_bytes_);
  } else {
    std::shared_ptr<h5::OpenFile> file = context_->files().acquire(f.file_id);
    const int64_t first_local = wants[0].first - starts_[fi];
    // One fstat per file per call catches a file truncated or rewritten since
    // open before any of its bytes are used.
    h5::check_unchanged(*file, context_->files().identity(f.file_id), l.dataset, wants[0].first,
                        l.kind == H5Layout::Kind::kContiguous ? row_offset(f, first_local) : 0);
    if (f.mapping != nullptr) {
      read_mapped_rows(fi, *file, wants, m, out);
    } else if (f.blocked) {
      read_blocked_rows(fi, *file, wants, m, out);
    } else if (l.kind == H5Layout::Kind::kContiguous || f.direct) {
      read_plain_rows(fi, *file, wants, m, out);
    } else {
      read_chunked_rows(fi, file.get(), wants, m, out);
    }
  }
  if (l.byteswap && elem_size_ > 1) {
    for (size_t k = 0; k < m; ++k) {
      byteswap_inplace(out + wants[k].second * row_bytes_, row_bytes_, elem_size_);
    }
  }
}

void H5RowSource::read_mapped_rows(size_t fi, const h5::OpenFile& file, const Want* wants,
                                   size_t m, uint8_t* out) {
  const File& f = files_[fi];
  const size_t rb = row_bytes_;
  const uint8_t* base = f.mapping->data();
  thread_local std::vector<CopySpan> spans;
  spans.resize(m);
  for (size_t k = 0; k < m; ++k) {
    const auto local = static_cast<size_t>(wants[k].first - starts_[fi]);
    spans[k] = CopySpan{out + static_cast<size_t>(wants[k].second) * rb, base + local * rb, rb};
  }
  const size_t done = copy_from_mapping(spans.data(), m);
  if (done < m) {
    const uint64_t offset =
        f.layout.offset + static_cast<uint64_t>(wants[done].first - starts_[fi]) * rb;
    CHUTE_CHECK(false, kIo,
                "'" << file.path() << "' dataset '" << f.layout.dataset << "' row "
                    << wants[done].first << ": the file ends before byte offset " << offset
                    << ": it was truncated after open");
  }
  bytes_read_.fetch_add(m * rb, std::memory_order_relaxed);
}

void H5RowSource::read_plain_rows(size_t fi, const h5::OpenFile& file, const Want* wants, size_t m,
                                  uint8_t* out) {
  const File& f = files_[fi];
  const size_t rb = row_bytes_;
  // Runs of rows stored back to back, each read with one request: all of
  // them are found first, so that a remote object gets them in one go.
  struct Run {
    size_t k;           // first want of the run
    size_t len;         // rows; 0: a repeated index, copied from the row before
    uint64_t offset;    // in the file
    size_t scratch;     // where in `scratch` a run whose slots are not adjacent lands
    bool scattered;
  };
  thread_local std::vector<Run> runs;
  thread_local std::vector<uint8_t> scratch;
  runs.clear();
  size_t scratch_bytes = 0;
  size_t k = 0;
  while (k < m) {
    if (k > 0 && wants[k].first == wants[k - 1].first) {
      runs.push_back(Run{k, 0, 0, 0, false});
      ++k;
      continue;
    }
    const int64_t local = wants[k].first - starts_[fi];
    const uint64_t offset = row_offset(f, local);
    if (offset == kUnallocated) {
      fill_row(f, out + static_cast<size_t>(wants[k].second) * rb);
      ++k;
      continue;
    }
    size_t len = 1;
    bool slots_adjacent = true;
    while (k + len < m && wants[k + len].first == wants[k + len - 1].first + 1 &&
           row_offset(f, local + static_cast<int64_t>(len)) == offset + len * rb) {
      if (wants[k + len].second != wants[k].second + len) slots_adjacent = false;
      ++len;
    }
    runs.push_back(Run{k, len, offset, scratch_bytes, !slots_adjacent});
    if (!slots_adjacent) scratch_bytes += len * rb;
    k += len;
  }
  scratch.resize(scratch_bytes);
  auto target = [&](const Run& r) {
    return r.scattered ? scratch.data() + r.scratch
                       : out + static_cast<size_t>(wants[r.k].second) * rb;
  };
  if (const RemoteRanges* remote = file.remote()) {
    thread_local std::vector<RemoteRanges::Span> spans;
    spans.clear();
    for (const Run& r : runs) {
      if (r.len > 0) spans.push_back(RemoteRanges::Span{r.offset, r.len * rb, target(r)});
    }
    remote->read(spans.data(), spans.size());
  } else {
    for (const Run& r : runs) {
      if (r.len == 0) continue;
      const size_t bytes = r.len * rb;
      const size_t got = file.read_at(target(r), bytes, r.offset);
      CHUTE_CHECK(got == bytes, kIo,
                  "'" << file.path() << "' dataset '" << f.layout.dataset << "' row "
                      << wants[r.k].first << ": short read at byte offset " << (r.offset + got)
                      << " (wanted " << bytes << " bytes at " << r.offset << ", got " << got
                      << "): the file was truncated after open");
    }
  }
  for (const Run& r : runs) {
    if (r.len == 0) {
      std::memcpy(out + static_cast<size_t>(wants[r.k].second) * rb,
                  out + static_cast<size_t>(wants[r.k - 1].second) * rb, rb);
      continue;
    }
    if (r.scattered) {
      for (size_t t = 0; t < r.len; ++t) {
        std::memcpy(out + static_cast<size_t>(wants[r.k + t].second) * rb,
                    scratch.data() + r.scratch + t * rb, rb);
      }
    }
    bytes_read_.fetch_add(r.len * rb, std::memory_order_relaxed);
  }
}

void H5RowSource::read_blocked_rows(size_t fi, const h5::OpenFile& file, const Want* wants,
                                    size_t m, uint8_t* out) {
  const size_t rb = row_bytes_;
  Prefetched fetched;
  if (file.remote() != nullptr) {
    const File& f = files_[fi];
    const uint64_t data_bytes = static_cast<uint64_t>(f.layout.num_rows) * rb;
    std::vector<std::pair<uint64_t, std::pair<uint64_t, size_t>>> missing;
    uint64_t last = std::numeric_limits<uint64_t>::max();
    for (size_t k = 0; k < m; ++k) {
      const uint64_t start = static_cast<uint64_t>(wants[k].first - starts_[fi]) * rb;
      for (uint64_t b = start / kBlockBytes; b <= (start + rb - 1) / kBlockBytes; ++b) {
        if (b == last || cached(fi, b)) continue;
        last = b;
        const uint64_t begin = b * kBlockBytes;
        missing.push_back({b, {f.layout.offset + begin,
                               static_cast<size_t>(std::min(kBlockBytes, data_bytes - begin))}});
      }
    }
    fetched = prefetch(file, missing);
  }
  // Sorted rows: neighbours usually share a block, so keep the last one
  // instead of asking the (locked) cache again.
  uint64_t memo_block = std::numeric_limits<uint64_t>::max();
  h5::ChunkCache::Data memo;
  for (size_t k = 0; k < m; ++k) {
    uint8_t* dst = out + static_cast<size_t>(wants[k].second) * rb;
    const uint64_t start = static_cast<uint64_t>(wants[k].first - starts_[fi]) * rb;
    size_t done = 0;
    while (done < rb) {  // a row may straddle two blocks
      const uint64_t pos = start + done;
      const uint64_t block = pos / kBlockBytes;
      if (block != memo_block) {
        memo = load_block(fi, block, file, wants[k].first, fetched);
        memo_block = block;
      }
      const size_t in_block = static_cast<size_t>(pos - block * kBlockBytes);
      const size_t n = std::min(rb - done, memo->size() - in_block);
      std::memcpy(dst + done, memo->data() + in_block, n);
      done += n;
    }
  }
}

h5::ChunkCache::Data H5RowSource::load_block(size_t fi, uint64_t block, const h5::OpenFile& file,
                                             int64_t row, Prefetched& fetched) {
  const File& f = files_[fi];
  const H5Layout& l = f.layout;
  CHUTE_CHECK(block <= std::numeric_limits<uint32_t>::max(), kUsage,
              "'" << l.path << "' dataset '" << l.dataset << "' is too large for cached blocks");
  const h5::ChunkKey key{source_id_, (static_cast<uint64_t>(fi) << 32) | block};
  return context_->cache().get(key, [&]() {
    const uint64_t data_bytes = static_cast<uint64_t>(l.num_rows) * row_bytes_;
    const uint64_t begin = block * kBlockBytes;
    const size_t len = static_cast<size_t>(std::min(kBlockBytes, data_bytes - begin));
    const uint64_t offset = l.offset + begin;
    auto it = fetched.find(block);
    if (it != fetched.end()) {
      bytes_read_.fetch_add(it->second.size(), std::memory_order_relaxed);
      return std::move(it->second);
    }
    std::vector<uint8_t> data(len);
    const size_t got = file.read_at(data.data(), len, offset);
    CHUTE_CHECK(got == len, kIo,
                "'" << file.path() << "' dataset '" << l.dataset << "' row " << row
                    << ": short read at byte offset " << (offset + got) << " (wanted " << len
                    << " bytes at " << offset << ", got " << got
                    << "): the file was truncated after open");
    bytes_read_.fetch_add(got, std::memory_order_relaxed);
    return data;
  });
}

void H5RowSource::read_chunked_rows(size_t fi, const h5::OpenFile* file, const Want* wants,
                                    size_t m, uint8_t* out) {
  const File& f = files_[fi];
  const H5Layout& l = f.layout;
  const size_t rank = f.grid.size();
  const int64_t c_rows = l.chunk_shape[0];
  Prefetched fetched;
  if (file != nullptr && file->remote() != nullptr) {
    // Every chunk the rows touch (a first-axis chunk index c0 covers the
    // grid positions [c0 * chunks_per_row, (c0 + 1) * chunks_per_row)).
    std::vector<std::pair<uint64_t, std::pair<uint64_t, size_t>>> missing;
    int64_t last_c0 = -1;
    for (size_t k = 0; k < m; ++k) {
      const int64_t c0 = (wants[k].first - starts_[fi]) / c_rows;
      if (c0 == last_c0) continue;
      last_c0 = c0;
      for (int64_t p = 0; p < f.chunks_per_row; ++p) {
        const int32_t ci = f.chunk_at[static_cast<size_t>(c0 * f.chunks_per_row + p)];
        if (ci < 0 || cached(fi, static_cast<uint32_t>(ci))) continue;
        const H5ChunkInfo& c = l.chunks[static_cast<size_t>(ci)];
        missing.push_back({static_cast<uint64_t>(ci), {c.address, static_cast<size_t>(c.size)}});
      }
    }
    fetched = prefetch(*file, missing);
  }
  // The last chunk used: consecutive sorted rows usually share it.
  int32_t memo_ci = -1;
  h5::ChunkCache::Data memo;
  std::vector<int64_t> g(rank, 0);
  for (size_t k = 0; k < m; ++k) {
    uint8_t* dst = out + static_cast<size_t>(wants[k].second) * row_bytes_;
    const int64_t row = wants[k].first;
    const int64_t local = row - starts_[fi];
    const int64_t c0 = local / c_rows;
    const int64_t rr = local - c0 * c_rows;
    // Walk every chunk the row crosses (more than one when chunks split the
    // non-first dimensions), copying each one's hyperslab piece.
    std::fill(g.begin(), g.end(), 0);
    for (int64_t p = 0; p < f.chunks_per_row; ++p) {
      int64_t lin = c0;
      for (size_t d = 1; d < rank; ++d) lin = lin * f.grid[d] + g[d];
      const int32_t ci = f.chunk_at[static_cast<size_t>(lin)];
      if (ci < 0) {
        copy_piece(f, nullptr, rr, g.data() + 1, dst);
      } else {
        if (ci != memo_ci) {
          memo = load_chunk(fi, ci, *file, row, fetched);
          memo_ci = ci;
        }
        if (f.full_rows) {
          std::memcpy(dst, memo->data() + static_cast<size_t>(rr) * f.chunk_row_bytes, row_bytes_);
        } else {
          copy_piece(f, memo->data(), rr, g.data() + 1, dst);
        }
      }
      for (size_t d = rank; d-- > 1;) {  // odometer over dims 1..
        if (++g[d] < f.grid[d]) break;
        g[d] = 0;
      }
    }
  }
}

h5::ChunkCache::Data H5RowSource::load_chunk(size_t fi, int32_t ci, const h5::OpenFile& file,
                                             int64_t row, Prefetched& fetched) {
  const File& f = files_[fi];
  const h5::ChunkKey key{source_id_, (static_cast<uint64_t>(fi) << 32) | static_cast<uint32_t>(ci)};
  return context_->cache().get(key, [&]() {
    const H5ChunkInfo& c = f.layout.chunks[static_cast<size_t>(ci)];
    auto it = fetched.find(static_cast<uint64_t>(ci));
    if (it != fetched.end()) {
      bytes_read_.fetch_add(it->second.size(), std::memory_order_relaxed);
      return decode_chunk(f, ci, std::move(it->second), row);
    }
    std::vector<uint8_t> raw(c.size);
    const size_t got = file.read_at(raw.data(), raw.size(), c.address);
    CHUTE_CHECK(got == raw.size(), kIo,
                chunk_where(f, ci, row) << ": short read (got " << got << " of " << raw.size()
                                        << " bytes): the file was truncated after open");
    bytes_read_.fetch_add(got, std::memory_order_relaxed);
    return decode_chunk(f, ci, std::move(raw), row);
  });
}

std::vector<uint8_t> H5RowSource::decode_chunk(const File& f, int32_t ci, std::vector<uint8_t> raw,
                                               int64_t row) const {
  const H5Layout& l = f.layout;
  const uint32_t mask = l.chunks[static_cast<size_t>(ci)].filter_mask;
  auto active = [&](size_t i) { return (mask & (uint32_t{1} << i)) == 0; };
  std::vector<uint8_t> data = std::move(raw);
  std::vector<uint8_t> tmp;
  for (size_t i = l.filters.size(); i-- > 0;) {
    if (!active(i)) continue;
    switch (l.filters[i]) {
      case H5Filter::kFletcher32:
        data.resize(h5::verify_fletcher32(data.data(), data.size(), chunk_where(f, ci, row)));
        break;
      case H5Filter::kDeflate: {
        // What deflate saw on write: the chunk plus the trailers of checksum
        // filters that ran before it.
        size_t expected = f.chunk_bytes;
        for (size_t j = 0; j < i; ++j) {
          if (active(j) && l.filters[j] == H5Filter::kFletcher32) expected += 4;
        }
        tmp.resize(expected);
        h5::inflate_exact(data.data(), data.size(), tmp.data(), expected, chunk_where(f, ci, row));
        data.swap(tmp);
        break;
      }
      case H5Filter::kShuffle:
        tmp.resize(data.size());
        h5::unshuffle(data.data(), data.size(), elem_size_, tmp.data());
        data.swap(tmp);
        break;
    }
  }
  CHUTE_CHECK(data.size() == f.chunk_bytes, kData,
              chunk_where(f, ci, row) << ": decoded to " << data.size() << " bytes, expected "
                                      << f.chunk_bytes);
  return data;
}

bool H5RowSource::cached(size_t fi, uint64_t unit) const {
  return context_->cache().contains(h5::ChunkKey{source_id_, (static_cast<uint64_t>(fi) << 32) | unit});
}

H5RowSource::Prefetched H5RowSource::prefetch(
    const h5::OpenFile& file,
    const std::vector<std::pair<uint64_t, std::pair<uint64_t, size_t>>>& units) const {
  Prefetched fetched;
  if (units.empty()) return fetched;
  std::vector<RemoteRanges::Span> spans;
  spans.reserve(units.size());
  for (const auto& [unit, extent] : units) {
    std::vector<uint8_t>& raw = fetched[unit];
    raw.resize(extent.second);
    spans.push_back(RemoteRanges::Span{extent.first, extent.second, raw.data()});
  }
  file.remote()->read(spans.data(), spans.size());
  return fetched;
}

void H5RowSource::fill_row(const File& f, uint8_t* row_out) const {
  if (f.fill_zero) {
    std::memset(row_out, 0, row_bytes_);
    return;
  }
  for (size_t i = 0; i < row_bytes_; i += elem_size_) {
    std::memcpy(row_out + i, f.layout.fill_value.data(), elem_size_);
  }
}

void H5RowSource::copy_piece(const File& f, const uint8_t* chunk, int64_t rr, const int64_t* g,
                             uint8_t* row_out) const {
  const size_t k = row_shape_.size();
  const size_t es = elem_size_;
  const std::vector<int64_t>& cs = f.layout.chunk_shape;
  if (k == 0) {
    if (chunk != nullptr) {
      std::memcpy(row_out, chunk + static_cast<size_t>(rr) * es, es);
    } else {
      std::memcpy(row_out, f.layout.fill_value.data(), es);
    }
    return;
  }
  // Element strides inside a chunk row and inside the output row.
  int64_t start[8], len[8], cstride[8], ostride[8], idx[8];
  CHUTE_CHECK(k <= 8, kUsage, "rows of rank " << k << " are not supported (max 8)");
  int64_t cs_acc = 1, os_acc = 1;
  for (size_t d = k; d-- > 0;) {
    cstride[d] = cs_acc;
    ostride[d] = os_acc;
    cs_acc *= cs[d + 1];
    os_acc *= row_shape_[d];
    start[d] = g[d] * cs[d + 1];
    len[d] = std::min(cs[d + 1], row_shape_[d] - start[d]);
    idx[d] = 0;
  }
  const int64_t chunk_row_elems = cs_acc;
  const size_t run = static_cast<size_t>(len[k - 1]) * es;
  while (true) {
    int64_t src = rr * chunk_row_elems;
    int64_t dst = start[k - 1];
    for (size_t d = 0; d + 1 < k; ++d) {
      src += idx[d] * cstride[d];
      dst += (start[d] + idx[d]) * ostride[d];
    }
    uint8_t* out = row_out + static_cast<size_t>(dst) * es;
    if (chunk != nullptr) {
      std::memcpy(out, chunk + static_cast<size_t>(src) * es, run);
    } else if (f.fill_zero) {
      std::memset(out, 0, run);
    } else {
      for (size_t b = 0; b < run; b += es) std::memcpy(out + b, f.layout.fill_value.data(), es);
    }
    if (k == 1) break;
    size_t d = k - 1;
    while (d-- > 0) {
      if (++idx[d] < len[d]) break;
      idx[d] = 0;
    }
    if (d == static_cast<size_t>(-1)) break;
  }
}

std::string H5RowSource::chunk_where(const File& f, int32_t ci, int64_t row) const {
  const H5ChunkInfo& c = f.layout.chunks[static_cast<size_t>(ci)];
  std::ostringstream os;
  os << "'" << f.layout.path << "' dataset '" << f.layout.dataset << "' chunk " << ci << " (";
  for (size_t d = 0; d < c.offset.size(); ++d) os << (d ? ", " : "") << c.offset[d];
  os << ") at byte offset " << c.address << " (" << c.size << " bytes, row " << row << ")";
  return os.str();
}

}  // namespace chute

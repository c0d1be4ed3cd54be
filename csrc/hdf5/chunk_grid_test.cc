// The chunk grid arithmetic of H5RowSource (which chunks a row crosses, which
// part of each chunk lands where in the row, edge chunks, unallocated chunks
// and fill values, rows spread over several files), tested through
// read_rows() on files written here byte by byte from hand-made layouts, the
// way h5py describes real ones.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "hdf5/h5_layout.h"
#include "hdf5/h5_row_source.h"

namespace chute {
namespace {

constexpr size_t kElem = sizeof(int32_t);
// Elements of an edge chunk that lie outside the dataset: HDF5 leaves them
// unspecified; a reader that copies one of them into a row is wrong.
constexpr int32_t kEdgePadding = -7;

struct Spec {
  const char* label;
  std::vector<int64_t> shape;  // the first dimension is the rows
  std::vector<int64_t> chunk;  // empty: contiguous storage
  std::vector<H5Filter> filters = {};
  std::set<int64_t> unallocated = {};  // linear grid positions with no chunk
  int32_t fill = 0;
  bool big_endian = false;
  bool first_chunk_skips_deflate = false;  // its filter mask says deflate was not applied
};

int64_t product(const std::vector<int64_t>& v, size_t from = 0) {
  int64_t p = 1;
  for (size_t i = from; i < v.size(); ++i) p *= v[i];
  return p;
}

// Distinct in every element of every file.
int32_t value_at(int file_index, const std::vector<int64_t>& shape, const std::vector<int64_t>& at) {
  int64_t lin = 0;
  for (size_t d = 0; d < shape.size(); ++d) lin = lin * shape[d] + at[d];
  return static_cast<int32_t>(lin * 3 + 1 + 100000 * file_index);
}

std::string encode(int32_t v, bool big_endian) {
  std::string out(kElem, '\0');
  std::memcpy(&out[0], &v, kElem);
  if (big_endian) std::reverse(out.begin(), out.end());
  return out;
}

// Calls fn(coords) for every index of `shape` in C order.
template <typename Fn>
void for_each_index(const std::vector<int64_t>& shape, Fn&& fn) {
  if (product(shape) == 0) return;
  std::vector<int64_t> at(shape.size(), 0);
  for (;;) {
    fn(at);
    size_t d = shape.size();
    while (d-- > 0) {
      if (++at[d] < shape[d]) break;
      at[d] = 0;
    }
    if (d == static_cast<size_t>(-1)) return;
  }
}

std::vector<int64_t> grid_of(const Spec& s) {
  std::vector<int64_t> g;
  for (size_t d = 0; d < s.shape.size(); ++d) g.push_back((s.shape[d] + s.chunk[d] - 1) / s.chunk[d]);
  return g;
}

int64_t grid_position(const Spec& s, const std::vector<int64_t>& at) {
  const std::vector<int64_t> g = grid_of(s);
  int64_t lin = 0;
  for (size_t d = 0; d < at.size(); ++d) lin = lin * g[d] + at[d] / s.chunk[d];
  return lin;
}

// The filters as HDF5's writer applies them, written independently of the
// engine's reader: byte shuffle, zlib deflate, Fletcher-32 over big-endian
// 16-bit words with a little-endian trailer.
std::string shuffle(const std::string& in) {
  const size_t n = in.size() / kElem;
  std::string out = in;
  for (size_t i = 0; i < n; ++i) {
    for (size_t b = 0; b < kElem; ++b) out[b * n + i] = in[i * kElem + b];
  }
  return out;
}

std::string deflate(const std::string& in) {
  uLongf size = compressBound(static_cast<uLong>(in.size()));
  std::string out(size, '\0');
  EXPECT_EQ(compress2(reinterpret_cast<Bytef*>(&out[0]), &size,
                      reinterpret_cast<const Bytef*>(in.data()), static_cast<uLong>(in.size()), 6),
            Z_OK);
  out.resize(size);
  return out;
}

uint32_t reference_fletcher32(const std::string& d) {
  uint64_t s1 = 0, s2 = 0;
  for (size_t i = 0; i < d.size(); i += 2) {
    const uint64_t hi = static_cast<uint8_t>(d[i]);
    const uint64_t lo = i + 1 < d.size() ? static_cast<uint8_t>(d[i + 1]) : 0;
    s1 = (s1 + ((hi << 8) | lo)) % 65535;
    s2 = (s2 + s1) % 65535;
  }
  return static_cast<uint32_t>((s2 << 16) | s1);
}

std::string with_fletcher32(const std::string& in) {
  return in + encode(static_cast<int32_t>(reference_fletcher32(in)), false);
}

struct Written {
  H5Layout layout;
  std::string bytes;  // the whole file
};

H5Layout describe(const std::string& path, H5Layout layout) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  layout.path = path;
  layout.file_size = static_cast<uint64_t>(st.st_size);
  layout.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  layout.inode = static_cast<uint64_t>(st.st_ino);
  return layout;
}

Written build(const Spec& s, int file_index) {
  Written w;
  H5Layout& l = w.layout;
  l.dataset = "/d";
  l.dtype = DType::kI32;
  l.byteswap = s.big_endian;
  l.num_rows = s.shape[0];
  l.row_shape.assign(s.shape.begin() + 1, s.shape.end());
  l.fill_value = std::vector<uint8_t>(kElem);
  const std::string fill = encode(s.fill, s.big_endian);
  std::memcpy(l.fill_value.data(), fill.data(), kElem);
  w.bytes.assign(100, 'J');  // the dataset never starts at byte 0
  if (s.chunk.empty()) {
    l.kind = H5Layout::Kind::kContiguous;
    l.offset = w.bytes.size();
    for_each_index(s.shape, [&](const std::vector<int64_t>& at) {
      w.bytes += encode(value_at(file_index, s.shape, at), s.big_endian);
    });
    return w;
  }
  l.kind = H5Layout::Kind::kChunked;
  l.chunk_shape = s.chunk;
  l.filters = s.filters;
  const std::vector<int64_t> grid = grid_of(s);
  std::vector<std::vector<int64_t>> positions;
  for_each_index(grid, [&](const std::vector<int64_t>& g) { positions.push_back(g); });
  // Stored back to front with gaps, so that no address follows from another.
  std::reverse(positions.begin(), positions.end());
  bool first = true;
  for (const std::vector<int64_t>& g : positions) {
    std::vector<int64_t> origin;
    for (size_t d = 0; d < g.size(); ++d) origin.push_back(g[d] * s.chunk[d]);
    if (s.unallocated.count(grid_position(s, origin)) != 0) continue;
    std::string data;
    for_each_index(s.chunk, [&](const std::vector<int64_t>& local) {
      std::vector<int64_t> at(local.size());
      bool inside = true;
      for (size_t d = 0; d < local.size(); ++d) {
        at[d] = origin[d] + local[d];
        inside = inside && at[d] < s.shape[d];
      }
      data += encode(inside ? value_at(file_index, s.shape, at) : kEdgePadding, s.big_endian);
    });
    uint32_t mask = 0;
    for (size_t i = 0; i < s.filters.size(); ++i) {
      if (s.filters[i] == H5Filter::kDeflate && first && s.first_chunk_skips_deflate) {
        mask |= uint32_t{1} << i;
        continue;
      }
      switch (s.filters[i]) {
        case H5Filter::kShuffle: data = shuffle(data); break;
        case H5Filter::kDeflate: data = deflate(data); break;
        case H5Filter::kFletcher32: data = with_fletcher32(data); break;
      }
    }
    first = false;
    w.bytes += "gap";
    H5ChunkInfo info;
    info.offset = origin;
    info.address = w.bytes.size();
    info.size = data.size();
    info.filter_mask = mask;
    l.chunks.push_back(info);
    w.bytes += data;
  }
  return w;
}

H5Layout write(const test::TempDir& dir, const std::string& name, const Spec& s, int file_index) {
  Written w = build(s, file_index);
  return describe(dir.write(name, w.bytes), std::move(w.layout));
}

// What row `local` of a file must read as, element by element.
std::vector<int32_t> expected_row(const Spec& s, int file_index, int64_t local) {
  std::vector<int32_t> row;
  const std::vector<int64_t> row_shape(s.shape.begin() + 1, s.shape.end());
  for_each_index(row_shape, [&](const std::vector<int64_t>& rest) {
    std::vector<int64_t> at = {local};
    at.insert(at.end(), rest.begin(), rest.end());
    const bool filled = !s.chunk.empty() && s.unallocated.count(grid_position(s, at)) != 0;
    row.push_back(filled ? s.fill : value_at(file_index, s.shape, at));
  });
  if (row_shape.empty() && row.empty()) row.push_back(0);  // never: a scalar row has one element
  return row;
}

std::vector<int32_t> read(RowSource& source, const std::vector<int64_t>& rows) {
  const size_t per_row = source.row_bytes() / kElem;
  std::vector<int32_t> out(rows.size() * per_row, 0x5a5a5a5a);
  source.read_rows(rows.data(), rows.size(), reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

// Ascending, descending, and scattered with repeats.
std::vector<std::vector<int64_t>> row_lists(int64_t n) {
  std::vector<int64_t> up(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) up[static_cast<size_t>(i)] = i;
  std::vector<int64_t> down(up.rbegin(), up.rend());
  std::vector<int64_t> scattered;
  uint64_t x = 12345;
  for (int64_t i = 0; i < 3 * n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    scattered.push_back(static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(n)));
  }
  return {up, down, scattered};
}

enum class Context { kMapped, kCached, kUncached };

std::shared_ptr<H5Context> make_context(Context c) {
  switch (c) {
    case Context::kMapped: return std::make_shared<H5Context>(size_t{1} << 20, 8, true);
    case Context::kCached: return std::make_shared<H5Context>(size_t{64} << 20, 8, false);
    case Context::kUncached: return std::make_shared<H5Context>(0, 1, false);
  }
  return nullptr;
}

const Spec kSpecs[] = {
    {"contiguous", {37, 5}, {}},
    {"contiguous_scalar_rows", {23}, {}},
    {"contiguous_big_endian", {11, 2, 3}, {}, {}, {}, 0, true},
    {"chunks_of_whole_rows", {37, 5}, {8, 5}},
    {"chunks_of_whole_rows_unallocated", {37, 5}, {8, 5}, {}, {1, 4}, -1},
    {"chunks_split_every_dimension", {13, 7, 6}, {4, 3, 4}},
    {"chunks_larger_than_the_dataset", {3, 2, 2}, {8, 4, 4}},
    {"chunks_split_with_unallocated_fill_zero", {13, 7, 6}, {4, 3, 4}, {}, {0, 5, 7, 20}},
    {"chunks_split_with_unallocated_fill_value", {13, 7, 6}, {4, 3, 4}, {}, {0, 5, 7, 20}, 99},
    {"scalar_rows_chunked", {50}, {7}, {}, {2}, -5},
    {"deflate", {13, 7, 6}, {4, 3, 4}, {H5Filter::kDeflate}},
    {"shuffle_deflate_fletcher32", {13, 7, 6}, {4, 3, 4},
     {H5Filter::kShuffle, H5Filter::kDeflate, H5Filter::kFletcher32}},
    {"fletcher32_before_deflate", {21, 4}, {5, 4}, {H5Filter::kFletcher32, H5Filter::kDeflate}},
    {"deflate_skipped_for_one_chunk", {21, 4}, {5, 4}, {H5Filter::kShuffle, H5Filter::kDeflate},
     {}, 0, false, true},
    {"deflate_whole_rows_big_endian", {30, 3}, {4, 3}, {H5Filter::kDeflate}, {3}, 7, true},
    {"four_dimensional_rows", {6, 3, 4, 5}, {2, 2, 3, 2}, {H5Filter::kDeflate}, {1}},
};

const Spec& spec_named(const std::string& label) {
  for (const Spec& s : kSpecs) {
    if (label == s.label) return s;
  }
  std::abort();
}

class ChunkGrid : public ::testing::TestWithParam<std::tuple<size_t, Context>> {};

TEST_P(ChunkGrid, RowsReadAsWritten) {
  const Spec& spec = kSpecs[std::get<0>(GetParam())];
  const test::TempDir dir;
  H5RowSource source(make_context(std::get<1>(GetParam())), "d",
                     {write(dir, "f.h5", spec, 0)});
  EXPECT_EQ(source.num_rows(), spec.shape[0]);
  EXPECT_EQ(source.row_shape(), std::vector<int64_t>(spec.shape.begin() + 1, spec.shape.end()));
  EXPECT_EQ(source.dtype(), DType::kI32);
  for (const std::vector<int64_t>& rows : row_lists(spec.shape[0])) {
    std::vector<int32_t> expected;
    for (int64_t r : rows) {
      const std::vector<int32_t> row = expected_row(spec, 0, r);
      expected.insert(expected.end(), row.begin(), row.end());
    }
    ASSERT_EQ(read(source, rows), expected);
  }
  EXPECT_GT(source.bytes_read(), 0u);
}

std::string spec_name(const ::testing::TestParamInfo<std::tuple<size_t, Context>>& info) {
  static const char* const kContexts[] = {"mapped", "cached", "uncached"};
  return std::string(kSpecs[std::get<0>(info.param)].label) + "_" +
         kContexts[static_cast<int>(std::get<1>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(Layouts, ChunkGrid,
                         ::testing::Combine(::testing::Range<size_t>(0, std::size(kSpecs)),
                                            ::testing::Values(Context::kMapped, Context::kCached,
                                                              Context::kUncached)),
                         spec_name);

TEST(ChunkGrid, RowsSpanSeveralFilesInOrder) {
  // One dataset over four files of different layouts (one empty, one never
  // written): global row i is row i - start of the file that holds it.
  const test::TempDir dir;
  const Spec specs[] = {
      {"a", {10, 3, 4}, {}},
      {"b", {0, 3, 4}, {4, 2, 2}},
      {"c", {17, 3, 4}, {4, 2, 3}, {H5Filter::kDeflate}, {1}},
      {"d", {6, 3, 4}, {5, 3, 4}},
  };
  std::vector<H5Layout> layouts;
  for (int i = 0; i < 4; ++i) layouts.push_back(write(dir, std::string(specs[i].label) + ".h5", specs[i], i));
  H5Layout unallocated = layouts[0];  // described, never written: all fill
  unallocated.kind = H5Layout::Kind::kUnallocated;
  unallocated.num_rows = 5;
  unallocated.fill_value = {1, 0, 0, 0};
  layouts.insert(layouts.begin() + 2, unallocated);
  for (Context c : {Context::kMapped, Context::kUncached}) {
    H5RowSource source(make_context(c), "d", layouts);
    ASSERT_EQ(source.num_rows(), 10 + 0 + 5 + 17 + 6);
    for (const std::vector<int64_t>& rows : row_lists(source.num_rows())) {
      std::vector<int32_t> expected;
      for (int64_t r : rows) {
        std::vector<int32_t> row;
        if (r < 10) {
          row = expected_row(specs[0], 0, r);
        } else if (r < 15) {
          row.assign(12, 1);
        } else if (r < 32) {
          row = expected_row(specs[2], 2, r - 15);
        } else {
          row = expected_row(specs[3], 3, r - 32);
        }
        expected.insert(expected.end(), row.begin(), row.end());
      }
      ASSERT_EQ(read(source, rows), expected);
    }
  }
}

TEST(ChunkGrid, ConcurrentReadersSeeTheSameRows) {
  const test::TempDir dir;
  const Spec& spec = spec_named("shuffle_deflate_fletcher32");
  H5RowSource source(make_context(Context::kCached), "d", {write(dir, "f.h5", spec, 0)});
  std::vector<int32_t> expected;
  const std::vector<int64_t> rows = row_lists(spec.shape[0])[2];
  for (int64_t r : rows) {
    const std::vector<int32_t> row = expected_row(spec, 0, r);
    expected.insert(expected.end(), row.begin(), row.end());
  }
  std::vector<std::thread> threads;
  std::vector<std::vector<int32_t>> got(4);
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] { got[t] = read(source, rows); });
  }
  for (std::thread& t : threads) t.join();
  for (const std::vector<int32_t>& g : got) EXPECT_EQ(g, expected);
}

// The kind and message of the error that constructing a source raises.
std::optional<Error> construct_error(std::vector<H5Layout> layouts) {
  return test::error_from([&] {
    H5RowSource source(make_context(Context::kUncached), "d", std::move(layouts));
  });
}

TEST(ChunkGrid, ChunkOutsideTheGridIsAnError) {
  const test::TempDir dir;
  H5Layout l = write(dir, "f.h5", {"x", {13, 4}, {4, 4}}, 0);
  l.chunks[0].offset = {16, 0};  // the grid has 4 chunk rows: 0, 4, 8, 12
  std::optional<Error> e = construct_error({l});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(), "'" + l.path + "' dataset '/d' chunk 0 at byte offset " +
                              std::to_string(l.chunks[0].address) + " lies outside the dataset");
  l.chunks[0].offset = {3, 0};  // not on a chunk boundary
  e = construct_error({l});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  l.chunks[0].offset = {0};  // wrong rank
  e = construct_error({l});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "'" + l.path + "' dataset '/d' chunk 0 has a malformed offset");
}

TEST(ChunkGrid, UnfilteredChunkOfTheWrongSizeIsAnError) {
  const test::TempDir dir;
  H5Layout l = write(dir, "f.h5", {"x", {13, 4}, {4, 4}}, 0);
  l.chunks[1].size = 10;
  const std::optional<Error> e = construct_error({l});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(), "'" + l.path + "' dataset '/d' chunk 1 at byte offset " +
                              std::to_string(l.chunks[1].address) +
                              " stores 10 bytes, expected 64");
}

TEST(ChunkGrid, InconsistentDescriptionsAreUsageErrors) {
  const test::TempDir dir;
  const H5Layout l = write(dir, "f.h5", {"x", {13, 4}, {4, 4}}, 0);
  H5Layout bad_rank = l;
  bad_rank.chunk_shape = {4};
  std::optional<Error> e = construct_error({bad_rank});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(), "'" + l.path + "' dataset '/d': chunk rank 1 != dataset rank 2");
  H5Layout zero_chunk = l;
  zero_chunk.chunk_shape = {4, 0};
  e = construct_error({zero_chunk});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "'" + l.path + "': chunk dimension 1 is 0");
  H5Layout other_shape = l;
  other_shape.row_shape = {5};
  e = construct_error({l, other_shape});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  H5Layout bad_fill = l;
  bad_fill.fill_value = {0, 0};
  e = construct_error({bad_fill});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "'" + l.path + "' dataset '/d': fill value has 2 bytes, expected 4");
  e = construct_error({});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "H5RowSource 'd' has no files");
}

// The message of the error that reading every row raises.
std::optional<Error> read_error(const H5Layout& l, Context c = Context::kUncached) {
  return test::error_from([&] {
    H5RowSource source(make_context(c), "d", {l});
    std::vector<int64_t> rows(static_cast<size_t>(source.num_rows()));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
    read(source, rows);
  });
}

TEST(ChunkGrid, CorruptDeflateStreamNamesTheChunk) {
  const test::TempDir dir;
  const Spec spec{"x", {8, 4}, {4, 4}, {H5Filter::kDeflate}};
  Written w = build(spec, 0);
  // Chunks are stored back to front: chunks[0] holds rows 4..7.
  const H5ChunkInfo& c = w.layout.chunks[0];
  w.bytes[c.address + c.size / 2] ^= 0x55;
  w.bytes[c.address + c.size / 2 + 1] ^= 0x55;
  const H5Layout l = describe(dir.write("f.h5", w.bytes), w.layout);
  const std::optional<Error> e = read_error(l);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  const std::string where = "'" + l.path + "' dataset '/d' chunk 0 (4, 0) at byte offset " +
                            std::to_string(c.address) + " (" + std::to_string(c.size) +
                            " bytes, row 4): ";
  EXPECT_EQ(e->message().substr(0, where.size()), where) << e->message();
}

TEST(ChunkGrid, Fletcher32MismatchNamesTheChunk) {
  const test::TempDir dir;
  const Spec spec{"x", {8, 4}, {4, 4}, {H5Filter::kFletcher32}};
  Written w = build(spec, 0);
  const H5ChunkInfo& c = w.layout.chunks[1];  // rows 0..3
  w.bytes[c.address] ^= 1;
  const H5Layout l = describe(dir.write("f.h5", w.bytes), w.layout);
  const std::optional<Error> e = read_error(l);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  const std::string where = "'" + l.path + "' dataset '/d' chunk 1 (0, 0) at byte offset " +
                            std::to_string(c.address) + " (68 bytes, row 0): fletcher32 checksum mismatch";
  EXPECT_EQ(e->message().substr(0, where.size()), where) << e->message();
}

TEST(ChunkGrid, FileChangedAfterItWasDescribedIsAnIoError) {
  for (Context c : {Context::kMapped, Context::kCached, Context::kUncached}) {
    const test::TempDir dir;
    const H5Layout l = write(dir, "f.h5", {"x", {8, 4}, {}}, 0);
    dir.write("f.h5", std::string(l.file_size + 10, 'X'));  // rewritten, bigger
    const std::optional<Error> e = read_error(l, c);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind(), ErrorKind::kIo);
    EXPECT_NE(e->message().find("'" + l.path + "'"), std::string::npos) << e->message();
    EXPECT_NE(e->message().find("reopen the dataset"), std::string::npos) << e->message();
  }
}

}  // namespace
}  // namespace chute

// Indexed sources (HDF5 datasets, in-memory arrays, tar shards with an
// index) and the engine that gathers rows from them. HDF5 layouts arrive as
// typed H5Layout objects that python/chute/datasets/h5.py fills from h5py; a tar
// index arrives as numpy columns that python/chute/sources/tarindex.py reads from
// the sidecar files; batches leave as zero-copy numpy arrays.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/block_columns.h"
#include "bindings/engine_face.h"
#include "bindings/errors.h"
#include "bindings/numpy_convert.h"
#include "bindings/pin_hooks.h"
#include "bindings/process_owned.h"
#include "bindings/registry.h"
#include "compose/catalog.h"
#include "compose/indexed_request.h"
#include "compose/stream_request.h"
#include "core/error.h"
#include "hdf5/h5_row_source.h"
#include "io/fetch_queue.h"
#include "pipeline/block_sample_source.h"
#include "pipeline/indexed_engine.h"
#include "pipeline/memory_row_source.h"
#include "tar/indexed_tar_source.h"
#include "tar/tar_index.h"

namespace py = pybind11;

namespace chute::bindings {

namespace {

DType parse_dtype(const std::string& descr, bool* swap, const std::string& what) {
  DType t{};
  CHUTE_CHECK(dtype_from_numpy_descr(descr, &t, swap), kUsage,
              what << ": unsupported dtype '" << descr << "'");
  return t;
}

using ChunkColumn = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;

// The allocated chunks, as h5py's chunk index lists them: element offsets
// (n x rank), byte addresses, stored sizes and filter masks.
void set_chunks(H5Layout& l, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& offsets,
                const ChunkColumn& addresses, const ChunkColumn& sizes,
                const py::array_t<uint32_t, py::array::c_style | py::array::forcecast>& masks) {
  const auto n = static_cast<size_t>(addresses.size());
  const size_t rank = l.chunk_shape.size();
  CHUTE_CHECK(offsets.ndim() == 2 && static_cast<size_t>(offsets.shape(0)) == n &&
                  static_cast<size_t>(offsets.shape(1)) == rank &&
                  static_cast<size_t>(sizes.size()) == n && static_cast<size_t>(masks.size()) == n,
              kUsage, "'" << l.path << "' dataset '" << l.dataset
                          << "': inconsistent chunk table (set chunk_shape first)");
  l.chunks.resize(n);
  const int64_t* off = offsets.data();
  for (size_t i = 0; i < n; ++i) {
    H5ChunkInfo& c = l.chunks[i];
    c.offset.assign(off + i * rank, off + (i + 1) * rank);
    c.address = addresses.data()[i];
    c.size = sizes.data()[i];
    c.filter_mask = masks.data()[i];
  }
}

std::shared_ptr<MemoryRowSource> make_array_source(const std::string& name, py::array array) {
  CHUTE_CHECK(array.ndim() >= 1, kUsage, "array '" << name << "' must have at least one dimension");
  const py::dtype type = array.dtype();
  const std::string str = py::str(type.attr("str")).cast<std::string>();
  DType dtype = DType::kU8;
  bool swap = false;
  // A type DType has no name for (complex, records, datetimes, strings)
  // travels as bytes that numpy views again as the type, named as .npy
  // files name it.
  std::string descr;
  if (!dtype_from_numpy_descr(str, &dtype, &swap)) {
    CHUTE_CHECK(!type.attr("hasobject").cast<bool>() && array.itemsize() > 0, kUsage,
                "array '" << name << "' has dtype " << py::str(type).cast<std::string>()
                          << ", which has no fixed size in bytes");
    const py::object literal = py::module_::import("numpy.lib.format").attr("dtype_to_descr")(type);
    descr = py::repr(literal).cast<std::string>();
  }
  CHUTE_CHECK(!swap, kUsage, "array '" << name << "' is not in native byte order");
  // Rows must be C-contiguous; the stride between rows may be anything.
  std::vector<int64_t> row_shape;
  py::ssize_t expect = array.itemsize();
  for (py::ssize_t d = array.ndim(); d-- > 1;) {
    CHUTE_CHECK(array.shape(d) <= 1 || array.strides(d) == expect, kUsage,
                "array '" << name << "' rows are not C-contiguous");
    expect *= array.shape(d);
  }
  for (py::ssize_t d = 1; d < array.ndim(); ++d) row_shape.push_back(array.shape(d));
  if (!descr.empty()) row_shape.push_back(array.itemsize());
  MemoryRowsRequest request;
  request.name = name;
  request.data = static_cast<const uint8_t*>(array.data());
  request.num_rows = array.shape(0);
  request.row_stride = array.strides(0);
  request.dtype = dtype;
  request.row_shape = std::move(row_shape);
  request.owner = keep_python_alive(array);
  request.element_descr = std::move(descr);
  return compose_memory_rows(std::move(request));
}

template <typename T>
using Column = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
IndexColumn<T> column_view(const Column<T>& a) {
  return IndexColumn<T>{a.data(), static_cast<size_t>(a.size())};
}

// Names are bytes in the archive; tarfile (and so webdataset) decodes them as
// UTF-8 with surrogateescape.
py::str decode_name(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

std::shared_ptr<IndexedTarSource> make_tar_source(
    const std::vector<std::string>& urls, const std::vector<std::string>& paths,
    const std::vector<int64_t>& sizes, const std::vector<int64_t>& mtimes_ns,
    const std::vector<std::string>& versions, const std::vector<std::string>& extensions,
    const Column<int64_t>& shard_starts, const Column<int64_t>& sample_offsets,
    const Column<int64_t>& key_starts, const Column<uint8_t>& keys,
    const Column<int64_t>& member_starts, const Column<int32_t>& member_extensions,
    const Column<int64_t>& member_offsets, const Column<int64_t>& member_sizes,
    const Column<int64_t>& member_header_offsets, uint64_t max_gap, uint64_t max_read,
    size_t max_open, const std::optional<std::shared_ptr<FetchQueue>>& remote) {
  CHUTE_CHECK(paths.size() == urls.size() && sizes.size() == urls.size() &&
                  mtimes_ns.size() == urls.size() && versions.size() == urls.size(),
              kUsage,
              "tar index: urls, paths, sizes, modification times and versions differ in length");
  TarIndexRequest request;
  TarIndex& index = request.index;
  for (size_t i = 0; i < urls.size(); ++i) {
    index.shards.push_back({urls[i], paths[i], ShardIdentity{sizes[i], mtimes_ns[i], versions[i]}});
  }
  index.extensions = extensions;
  index.shard_starts = column_view(shard_starts);
  index.sample_offsets = column_view(sample_offsets);
  index.key_starts = column_view(key_starts);
  index.keys = IndexColumn<char>{reinterpret_cast<const char*>(keys.data()),
                                 static_cast<size_t>(keys.size())};
  index.member_starts = column_view(member_starts);
  index.member_extensions = column_view(member_extensions);
  index.member_offsets = column_view(member_offsets);
  index.member_sizes = column_view(member_sizes);
  index.member_header_offsets = column_view(member_header_offsets);
  // The arrays as converted (forcecast may have copied them) live as long as
  // the index.
  index.owner = keep_python_alive(py::make_tuple(shard_starts, sample_offsets, key_starts, keys,
                                                 member_starts, member_extensions, member_offsets,
                                                 member_sizes, member_header_offsets));
  request.options.max_gap = max_gap;
  request.options.max_read = max_read;
  request.options.max_open = max_open;
  // Remote urls are read with ranged requests through chute.remote's queue.
  if (remote) request.remote = *remote;
  return compose_tar_index_source(std::move(request));
}

// A header digest as an index records it: 16 hex digits.
std::string digest_hex(uint64_t digest) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
  return std::string(hex);
}

std::string tar_headers_digest(const std::string& url, const Column<int64_t>& header_offsets,
                               const Column<int64_t>& payload_offsets, int64_t size,
                               const std::string& version,
                               const std::optional<std::shared_ptr<FetchQueue>>& remote) {
  CHUTE_CHECK(header_offsets.size() == payload_offsets.size(), kUsage,
              "tar headers digest: " << header_offsets.size() << " header offsets for "
                                     << payload_offsets.size() << " payload offsets");
  // The digest runs over members in order; how they group into samples does not matter.
  std::vector<ScannedSample> samples(1);
  for (py::ssize_t i = 0; i < header_offsets.size(); ++i) {
    CHUTE_CHECK(header_offsets.data()[i] >= 0 && payload_offsets.data()[i] >= 0, kUsage,
                "tar headers digest: member " << i << " has a negative offset");
    ScannedMember m;
    m.header_offset = static_cast<uint64_t>(header_offsets.data()[i]);
    m.offset = static_cast<uint64_t>(payload_offsets.data()[i]);
    samples[0].members.push_back(m);
  }
  uint64_t digest = 0;
  {
    py::gil_scoped_release release;
    const TarIndex::Shard shard{url, url, ShardIdentity{size, -1, version}};
    digest = header_digest(samples, *shard_reader_for(shard, remote ? *remote : nullptr));
  }
  return digest_hex(digest);
}

// Block `block` of `source`: for each of its columns (data, offsets, present),
// as block_columns.h takes them.
void put_block(BlockSampleSource& source, size_t block, const std::vector<BlockColumnArgs>& columns) {
  py::list held;
  std::vector<BlockColumn> out =
      block_columns(columns, source.block_rows(block), "block " + std::to_string(block), held);
  std::shared_ptr<void> owner = keep_python_alive(std::move(held));
  {
    py::gil_scoped_release release;
    source.put(block, std::move(out), std::move(owner));
  }
  // The block it replaced, if no sample points into it any more.
  release_dropped_python_objects();
}

py::tuple scan_tar_index_py(const std::string& path) {
  std::vector<ScannedSample> samples;
  uint64_t digest = 0;
  {
    py::gil_scoped_release release;
    SourceOptions options;
    std::optional<uint64_t> in_place;
    samples = scan_tar_index(open_source(path, options), &in_place);
    const TarIndex::Shard shard{path, path, ShardIdentity{}};
    digest = in_place ? *in_place : header_digest(samples, *shard_reader_for(shard, nullptr));
  }
  size_t members = 0;
  for (const ScannedSample& s : samples) members += s.members.size();
  py::list keys, extensions;
  py::array_t<int64_t> offsets(static_cast<py::ssize_t>(samples.size()));
  py::array_t<int64_t> counts(static_cast<py::ssize_t>(samples.size()));
  py::array_t<int64_t> member_offsets(static_cast<py::ssize_t>(members));
  py::array_t<int64_t> member_sizes(static_cast<py::ssize_t>(members));
  py::array_t<int64_t> member_header_offsets(static_cast<py::ssize_t>(members));
  int64_t* off = offsets.mutable_data();
  int64_t* cnt = counts.mutable_data();
  int64_t* moff = member_offsets.mutable_data();
  int64_t* msize = member_sizes.mutable_data();
  int64_t* mheader = member_header_offsets.mutable_data();
  size_t j = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const ScannedSample& s = samples[i];
    keys.append(decode_name(s.key));
    off[i] = static_cast<int64_t>(s.offset);
    cnt[i] = static_cast<int64_t>(s.members.size());
    for (const ScannedMember& m : s.members) {
      extensions.append(decode_name(m.extension));
      moff[j] = static_cast<int64_t>(m.offset);
      msize[j] = static_cast<int64_t>(m.size);
      mheader[j] = static_cast<int64_t>(m.header_offset);
      ++j;
    }
  }
  return py::make_tuple(keys, offsets, counts, extensions, member_offsets, member_sizes,
                        member_header_offsets, digest_hex(digest));
}

}  // namespace

void register_indexed(py::module_& m) {
  py::class_<RowSource, std::shared_ptr<RowSource>>(m, "RowSource",
                                                    "Rows of fixed shape, gathered by index.")
      .def_property_readonly("name", &RowSource::name)
      .def_property_readonly("num_rows", &RowSource::num_rows)
      .def_property_readonly("row_shape", &RowSource::row_shape)
      .def_property_readonly("dtype",
                             [](const RowSource& s) {
                               return s.element_descr().empty() ? numpy_dtype(s.dtype())
                                                                : numpy_dtype(s.element_descr());
                             })
      .def_property_readonly("bytes_read", &RowSource::bytes_read);

  py::class_<H5Context, std::shared_ptr<H5Context>>(
      m, "H5Context", "Open-file pool and decompressed-chunk cache shared by HDF5 sources.")
      .def(py::init<size_t, size_t, bool>(), py::arg("chunk_cache_bytes"),
           py::arg("max_open_files"), py::arg("map_files") = true)
      .def("set_remote", &H5Context::set_remote, py::arg("queue"),
           "Layouts whose path is a remote url are read through this FetchQueue.")
      .def("stats", [](H5Context& c) {
        const h5::ChunkCacheStats s = c.cache().stats();
        py::dict d;
        d["chunk_cache_hits"] = s.hits;
        d["chunk_cache_misses"] = s.misses;
        d["chunk_cache_evictions"] = s.evictions;
        d["chunk_cache_bytes"] = s.bytes;
        d["chunk_cache_capacity"] = s.capacity;
        d["file_opens"] = c.files().opens();
        d["open_files"] = c.files().open_count();
        return d;
      });

  py::enum_<H5Layout::Kind>(m, "H5LayoutKind")
      .value("CONTIGUOUS", H5Layout::Kind::kContiguous)
      .value("CHUNKED", H5Layout::Kind::kChunked)
      .value("UNALLOCATED", H5Layout::Kind::kUnallocated);
  py::enum_<H5Filter>(m, "H5Filter")
      .value("DEFLATE", H5Filter::kDeflate)
      .value("SHUFFLE", H5Filter::kShuffle)
      .value("FLETCHER32", H5Filter::kFletcher32);
  py::class_<H5Layout>(m, "H5Layout",
                       "How one HDF5 dataset is stored in one file, as h5py describes it.")
      .def(py::init<>())
      .def_readwrite("path", &H5Layout::path)
      .def_readwrite("dataset", &H5Layout::dataset)
      .def_property(
          "dtype",
          [](const H5Layout& l) {
            py::object dtype = numpy_dtype(l.dtype);
            if (l.byteswap) dtype = dtype.attr("newbyteorder")("S");
            return dtype.attr("str").cast<std::string>();
          },
          [](H5Layout& l, const std::string& descr) {
            l.dtype = parse_dtype(descr, &l.byteswap, "'" + l.path + "' dataset '" + l.dataset + "'");
          },
          "numpy's dtype string, byte order included (e.g. '>f4').")
      .def_readwrite("row_shape", &H5Layout::row_shape)
      .def_readwrite("num_rows", &H5Layout::num_rows)
      .def_readwrite("kind", &H5Layout::kind)
      .def_readwrite("offset", &H5Layout::offset, "CONTIGUOUS: byte offset of row 0.")
      .def_readwrite("chunk_shape", &H5Layout::chunk_shape, "CHUNKED: full rank.")
      .def_readwrite("filters", &H5Layout::filters, "CHUNKED: in the order they were applied.")
      .def("set_chunks", &set_chunks, py::arg("offsets"), py::arg("addresses"), py::arg("sizes"),
           py::arg("masks"),
           "CHUNKED: the allocated chunks: element offsets (n x rank, after chunk_shape is "
           "set), byte addresses, stored sizes, filter masks.")
      .def_property(
          "fill",
          [](const H5Layout& l) {
            return py::bytes(reinterpret_cast<const char*>(l.fill_value.data()), l.fill_value.size());
          },
          [](H5Layout& l, const py::bytes& fill) {
            const std::string bytes = fill;
            l.fill_value.assign(bytes.begin(), bytes.end());
          },
          "One element in the file's byte order; unallocated storage reads as it.")
      .def_readwrite("file_size", &H5Layout::file_size)
      .def_readwrite("mtime_ns", &H5Layout::mtime_ns)
      .def_readwrite("inode", &H5Layout::inode)
      .def_readwrite("version", &H5Layout::version,
                     "A remote object's ETag (else modification time) when described.");

  py::class_<H5RowSource, RowSource, std::shared_ptr<H5RowSource>>(
      m, "H5Source", "One HDF5 dataset over one or more files, read natively.")
      .def(py::init([](std::shared_ptr<H5Context> context, const std::string& name,
                       std::vector<H5Layout> layouts) {
             return compose_h5_rows(std::move(context), name, std::move(layouts));
           }),
           py::arg("context"), py::arg("name"), py::arg("layouts"));

  py::class_<MemoryRowSource, RowSource, std::shared_ptr<MemoryRowSource>>(
      m, "ArraySource", "Rows of an array the source keeps alive (numpy, memmap, tensor.numpy()).")
      .def(py::init(&make_array_source), py::arg("name"), py::arg("array"));

  m.def("scan_tar_index", &scan_tar_index_py, py::arg("path"),
        "The content of a tar shard's sidecar index, grouped by the engine's key rule: "
        "(keys, sample header offsets, members per sample, member extensions, payload offsets, "
        "payload sizes, header offsets, header digest), the member columns in archive order; "
        "the digest (16 hex digits) covers the bytes of those members' headers.");

  m.def("tar_headers_digest", &tar_headers_digest, py::arg("url"), py::arg("header_offsets"),
        py::arg("payload_offsets"), py::arg("size"), py::arg("version") = "",
        py::arg("remote") = py::none(),
        "The header digest of a tar shard as scan_tar_index gives it, read at the members' "
        "header offsets (up to each payload offset) in one batch of ranged requests: through "
        "the FetchQueue `remote` for a remote url, else from the local file. The shard must "
        "have `size` bytes (and `version`, when given) or DataError is raised.");

  py::class_<IndexedSampleSource, std::shared_ptr<IndexedSampleSource>>(
      m, "IndexedSampleSource", "Samples read by id (sample mode of the IndexedEngine).")
      .def_property_readonly("num_samples", &IndexedSampleSource::num_samples);

  py::class_<IndexedTarSource, IndexedSampleSource, std::shared_ptr<IndexedTarSource>>(
      m, "TarIndexSource",
      "Tar shards read by sample id through their index; neighbouring samples share a read.")
      .def(py::init(&make_tar_source), py::arg("urls"), py::arg("paths"), py::arg("sizes"),
           py::arg("mtimes_ns"), py::arg("versions"), py::arg("extensions"),
           py::arg("shard_starts"), py::arg("sample_offsets"), py::arg("key_starts"),
           py::arg("keys"), py::arg("member_starts"), py::arg("member_extensions"),
           py::arg("member_offsets"), py::arg("member_sizes"), py::arg("member_header_offsets"),
           py::arg("max_gap") = IndexedTarOptions{}.max_gap,
           py::arg("max_read") = IndexedTarOptions{}.max_read,
           py::arg("max_open") = IndexedTarOptions{}.max_open, py::arg("remote") = py::none())
      .def_property_readonly("reads", &IndexedTarSource::reads, "Range reads made so far.")
      .def_property_readonly("bytes_read", &IndexedTarSource::bytes_read,
                             "Bytes those reads brought in.");

  py::class_<BlockSampleSource, IndexedSampleSource, std::shared_ptr<BlockSampleSource>>(
      m, "BlockSampleSource",
      "Samples whose members lie in blocks of memory handed over by their owner (Parquet row "
      "groups read by pyarrow): put a block before submitting a batch that reads it, drop it "
      "once no batch in flight does.")
      .def(py::init([](std::vector<std::string> extensions, std::vector<std::string> column_names,
                       std::vector<int64_t> block_starts, std::vector<std::string> block_names,
                       std::vector<std::string> block_urls) {
             return compose_block_samples({std::move(extensions), std::move(column_names),
                                           std::move(block_starts), std::move(block_names),
                                           std::move(block_urls)});
           }),
           py::arg("extensions"), py::arg("column_names"), py::arg("block_starts"),
           py::arg("block_names"), py::arg("block_urls"))
      .def("put", &put_block, py::arg("block"), py::arg("columns"),
           "Block `block`'s columns, one (data buffer, int64 offsets, uint8 present or None) "
           "per extension; the buffers are used in place and kept alive.")
      // With the GIL held: the block's buffers, unless a sample still points
      // into them, are released here and now.
      .def("drop", &BlockSampleSource::drop, py::arg("block"))
      .def_property_readonly("blocks_held", &BlockSampleSource::blocks_held)
      .def_property_readonly("bytes_read", &BlockSampleSource::bytes_read,
                             "Payload bytes handed to the decoders so far.");

  py::class_<IndexedPlan>(m, "IndexedPlan", "What an IndexedEngine reads and how.")
      .def(py::init<>())
      .def_readwrite("sources", &IndexedPlan::sources,
                     "One row source per output field, all with the same number of rows.")
      .def_readwrite("num_rows", &IndexedPlan::num_rows,
                     "The dataset's rows (-1: the sources'); bounds the indices when no field "
                     "is read by a source.")
      .def_readwrite("num_threads", &IndexedPlan::num_threads)
      .def_readwrite("max_in_flight", &IndexedPlan::max_in_flight,
                     "Batches started ahead of the consumer.")
      .def_readwrite("piece_rows", &IndexedPlan::piece_rows,
                     "Rows per piece of work; 0 picks it from the row size.")
      .def_property(
          "samples",
          [](const IndexedPlan& p) { return std::const_pointer_cast<IndexedSampleSource>(p.samples); },
          [](IndexedPlan& p, std::shared_ptr<IndexedSampleSource> source) {
            p.samples = std::move(source);
          },
          "Sample mode: the source read by id (instead of `sources`).")
      .def(
          "set_fields",
          [](IndexedPlan& p, const std::vector<FieldRequest>& fields) {
            p.decoding.fields.clear();
            for (const FieldRequest& f : fields) {
              FieldPlan field = f.field;
              field.decoder = field_decoder_for(f.codec, field.name);
              p.decoding.fields.push_back(std::move(field));
            }
          },
          py::arg("fields"), "Sample mode: the output fields (FieldPlan, as for a StreamPlan).")
      .def_property(
          "keep_other_members", [](const IndexedPlan& p) { return p.decoding.keep_other_members; },
          [](IndexedPlan& p, bool v) { p.decoding.keep_other_members = v; })
      .def_property(
          "collect_keys", [](const IndexedPlan& p) { return p.decoding.collect_keys; },
          [](IndexedPlan& p, bool v) { p.decoding.collect_keys = v; })
      .def_property(
          "seed", [](const IndexedPlan& p) { return p.decoding.seed; },
          [](IndexedPlan& p, uint64_t v) { p.decoding.seed = v; })
      .def_property(
          "on_error", [](const IndexedPlan& p) { return p.decoding.on_error; },
          [](IndexedPlan& p, ErrorPolicy v) { p.decoding.on_error = v; })
      .def(
          "set_pin_hooks",
          [](IndexedPlan& p, uintptr_t register_fn, uintptr_t unregister_fn) {
            p.pin = pin_hooks_from_addresses(register_fn, unregister_fn);
          },
          py::arg("register_fn"), py::arg("unregister_fn"),
          "Addresses of cudaHostRegister/cudaHostUnregister (see chute.gpu.pinning).");

  using OwnedIndexedEngine = ProcessOwned<IndexedEngine>;
  py::class_<OwnedIndexedEngine>(m, "IndexedEngine",
                                 "Native threads gathering index batches from row sources.")
      .def(py::init([](IndexedPlan plan) {
             return std::make_unique<OwnedIndexedEngine>(
                 std::make_unique<IndexedEngine>(std::move(plan)));
           }),
           py::arg("plan"))
      .def_property_readonly("num_rows",
                             [](const OwnedIndexedEngine& owned) { return owned.get().num_rows(); })
      .def(
          "submit",
          [](OwnedIndexedEngine& owned,
             py::array_t<int64_t, py::array::c_style | py::array::forcecast> idx, int64_t epoch) {
            IndexedEngine& e = owned.get();
            CHUTE_CHECK(idx.ndim() == 1, kUsage, "indices must be one-dimensional");
            const int64_t* data = idx.data();
            const auto n = static_cast<size_t>(idx.size());
            py::gil_scoped_release release;
            return e.submit(data, n, epoch);
          },
          py::arg("indices"), py::arg("epoch") = 0,
          "Queue a batch of row indices; returns its sequence number. In sample mode the "
          "decoders' random draws for sample i derive from (seed, epoch, i).")
      .def(
          "next",
          [](OwnedIndexedEngine& owned, double timeout) {
            IndexedEngine& engine = owned.get();
            return wait_for_batch(
                [&](Batch* out, double slice) { return engine.next(out, slice); }, timeout);
          },
          py::arg("timeout") = 0.0,
          "The next batch in submission order (one column per source). Raises TimeoutError "
          "when `timeout` seconds (0: wait forever) pass first, and the error of a failed batch "
          "at its position.")
      .def(
          "gather",
          [](OwnedIndexedEngine& owned,
             py::array_t<int64_t, py::array::c_style | py::array::forcecast> idx) {
            IndexedEngine& engine = owned.get();
            CHUTE_CHECK(idx.ndim() == 1, kUsage, "indices must be one-dimensional");
            Batch batch;
            {
              ReleasedGil released;
              engine.gather(idx.data(), static_cast<size_t>(idx.size()), &batch);
            }
            // The samples it read may have held the last reference to a block
            // that Python dropped meanwhile.
            release_dropped_python_objects();
            py::list columns(batch.columns.size());
            for (size_t i = 0; i < batch.columns.size(); ++i) {
              columns[i] = column_to_python(batch.columns[i]);
            }
            return columns;
          },
          py::arg("indices"),
          "An engine without threads (num_threads 0): the columns of the batch of `indices`, "
          "made on this thread with the GIL released. Nothing may be outstanding.")
      .def("close", &OwnedIndexedEngine::close,
           "Stops the threads and drops what is queued; nothing in a forked copy.")
      .def("outstanding",
           [](const OwnedIndexedEngine& owned) {
             return owned.here() ? owned.get().outstanding() : int64_t{0};
           })
      .def("stats",
           [](const OwnedIndexedEngine& owned) {
             return stats_dict(owned.here() ? owned.get().stats() : EngineStats{});
           })
      .def(
          "take_skipped",
          [](OwnedIndexedEngine& owned) {
            py::list out;
            if (!owned.here()) return out;
            for (const SkippedSample& skipped : owned.get().take_skipped()) {
              out.append(python_skipped(skipped));
            }
            return out;
          },
          "Sample mode: exceptions of the samples skipped since the last call, oldest first; "
          "each names its sample as data: sample_index (the id it was submitted as), "
          "sample_source (which shard or row group holds it) and sample_offset (where it starts "
          "there: a byte offset, a row of a row group), None where not known.");
}

}  // namespace chute::bindings

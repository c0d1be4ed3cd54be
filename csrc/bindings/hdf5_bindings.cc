// HDF5 datasets read natively: layouts arrive as typed H5Layout objects
// that python/chute/datasets/h5.py fills from h5py, and H5Source gathers
// their rows for the IndexedEngine (indexed_engine_bindings.cc).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings/numpy_convert.h"
#include "bindings/registry.h"
#include "compose/indexed_request.h"
#include "core/error.h"
#include "hdf5/h5_row_source.h"
#include "io/fetch_queue.h"

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

}  // namespace

void register_hdf5(py::module_& m) {
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
}

const BindingsFile kHdf5Bindings{"_core", "hdf5", {"indexed", "remote"}, register_hdf5};

}  // namespace chute::bindings

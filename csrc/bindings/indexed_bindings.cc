// Indexed sources (HDF5 datasets, in-memory arrays) and the engine that
// gathers rows from them. HDF5 layouts arrive as typed H5Layout objects that
// python/chute/h5.py fills from h5py; batches leave as zero-copy numpy arrays.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bindings/engine_face.h"
#include "bindings/numpy_convert.h"
#include "bindings/pin_hooks.h"
#include "bindings/registry.h"
#include "core/error.h"
#include "hdf5/h5_row_source.h"
#include "io/fetch_queue.h"
#include "io/mapped_region.h"
#include "io/unique_fd.h"
#include "pipeline/indexed_engine.h"
#include "pipeline/memory_row_source.h"

namespace py = pybind11;

namespace chute::bindings {

namespace {

// The Python object owning a MemoryRowSource's memory. Dropped with the GIL
// (the source may die on any thread that held the last engine reference).
std::shared_ptr<void> keep_python_alive(py::object obj) {
  auto* held = new py::object(std::move(obj));
  return std::shared_ptr<void>(held, [](void* p) {
    if (!Py_IsInitialized()) return;  // interpreter gone: leaking beats crashing
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
}

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
  bool swap = false;
  const std::string descr = py::str(array.dtype().attr("str")).cast<std::string>();
  const DType dtype = parse_dtype(descr, &swap, "array '" + name + "'");
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
  const auto* data = static_cast<const uint8_t*>(array.data());
  return std::make_shared<MemoryRowSource>(name, data, array.shape(0), array.strides(0), dtype,
                                           std::move(row_shape), keep_python_alive(array));
}

}  // namespace

void register_indexed(py::module_& m) {
  py::class_<RowSource, std::shared_ptr<RowSource>>(m, "RowSource",
                                                    "Rows of fixed shape, gathered by index.")
      .def_property_readonly("name", &RowSource::name)
      .def_property_readonly("num_rows", &RowSource::num_rows)
      .def_property_readonly("row_shape", &RowSource::row_shape)
      .def_property_readonly("dtype", [](const RowSource& s) { return numpy_dtype(s.dtype()); })
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

  m.def(
      "_mapped_read",
      [](const std::string& path, uint64_t offset, size_t size) {
        UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        CHUTE_CHECK(fd.valid(), kIo, "cannot open '" << path << "': " << std::strerror(errno));
        std::string out(size, '\0');
        size_t done = 0;
        {
          py::gil_scoped_release release;
          MappedRegion region(fd.get(), offset, size, path);
          CopySpan span{reinterpret_cast<uint8_t*>(out.data()), region.data(), size};
          done = copy_from_mapping(&span, 1);
        }
        CHUTE_CHECK(done == 1, kIo,
                    "'" << path << "' ends inside bytes [" << offset << ", " << offset + size
                        << ") of the mapping");
        return py::bytes(out);
      },
      py::arg("path"), py::arg("offset"), py::arg("size"),
      "Diagnostic: bytes [offset, offset + size) of a file copied through the guarded mapping "
      "path that contiguous HDF5 rows take; a range past the end of the file raises ReadError "
      "instead of killing the process with SIGBUS.");

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
             return std::make_shared<H5RowSource>(std::move(context), name, std::move(layouts));
           }),
           py::arg("context"), py::arg("name"), py::arg("layouts"));

  py::class_<MemoryRowSource, RowSource, std::shared_ptr<MemoryRowSource>>(
      m, "ArraySource", "Rows of an array the source keeps alive (numpy, memmap, tensor.numpy()).")
      .def(py::init(&make_array_source), py::arg("name"), py::arg("array"));

  py::class_<IndexedPlan>(m, "IndexedPlan", "What an IndexedEngine reads and how.")
      .def(py::init<>())
      .def_readwrite("sources", &IndexedPlan::sources,
                     "One row source per output field, all with the same number of rows.")
      .def_readwrite("num_threads", &IndexedPlan::num_threads)
      .def_readwrite("max_in_flight", &IndexedPlan::max_in_flight,
                     "Batches started ahead of the consumer.")
      .def_readwrite("piece_rows", &IndexedPlan::piece_rows,
                     "Rows per piece of work; 0 picks it from the row size.")
      .def(
          "set_pin_hooks",
          [](IndexedPlan& p, uintptr_t register_fn, uintptr_t unregister_fn) {
            p.pin = pin_hooks_from_addresses(register_fn, unregister_fn);
          },
          py::arg("register_fn"), py::arg("unregister_fn"),
          "Addresses of cudaHostRegister/cudaHostUnregister (see chute.pinning).");

  py::class_<IndexedEngine>(m, "IndexedEngine",
                            "Native threads gathering index batches from row sources.")
      .def(py::init<IndexedPlan>(), py::arg("plan"))
      .def_property_readonly("num_rows", &IndexedEngine::num_rows)
      .def(
          "submit",
          [](IndexedEngine& e, py::array_t<int64_t, py::array::c_style | py::array::forcecast> idx) {
            CHUTE_CHECK(idx.ndim() == 1, kUsage, "indices must be one-dimensional");
            const int64_t* data = idx.data();
            const auto n = static_cast<size_t>(idx.size());
            py::gil_scoped_release release;
            return e.submit(data, n);
          },
          py::arg("indices"), "Queue a batch of row indices; returns its sequence number.")
      .def(
          "next",
          [](IndexedEngine& engine, double timeout) {
            return wait_for_batch(
                [&](Batch* out, double slice) { return engine.next(out, slice); }, timeout);
          },
          py::arg("timeout") = 0.0,
          "The next batch in submission order (one column per source). Raises TimeoutError "
          "when `timeout` seconds (0: wait forever) pass first, and the error of a failed batch "
          "at its position.")
      .def("close", &IndexedEngine::close, py::call_guard<py::gil_scoped_release>())
      .def("outstanding", &IndexedEngine::outstanding)
      .def("stats", [](const IndexedEngine& e) { return stats_dict(e.stats()); });
}

}  // namespace chute::bindings

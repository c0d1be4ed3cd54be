// Samples in blocks of memory their owner hands over (Parquet row groups
// read by pyarrow, on Python reader threads): BlockSampleSource, an
// IndexedSampleSource of the IndexedEngine.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings/block_columns.h"
#include "bindings/engine_face.h"
#include "bindings/registry.h"
#include "compose/indexed_request.h"
#include "core/error.h"
#include "sources/block_sample_source.h"

namespace py = pybind11;

namespace chute::bindings {

namespace {

// Block `block` of `source`: for each of its columns (data, offsets, present),
// as block_columns.h takes them.
void put_block(BlockSampleSource& source, size_t block, const std::vector<BlockColumnArgs>& columns) {
  py::list held;
  std::vector<BlockColumn> out =
      block_columns(columns, source.block_rows(block), "block " + std::to_string(block), held);
  std::shared_ptr<void> owner = keep_python_alive(std::move(held));
  std::exception_ptr failure;
  {
    // Called by a reader thread (a daemon), which may be here when Python exits.
    ReleasedGil released;  // never left by an exception (engine_face.h)
    try {
      source.put(block, std::move(out), std::move(owner));
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  // The block it replaced, if no sample points into it any more.
  release_dropped_python_objects();
}

}  // namespace

void register_block_source(py::module_& m) {
  py::class_<BlockSampleSource, IndexedSampleSource, std::shared_ptr<BlockSampleSource>>(
      m, "BlockSampleSource",
      "Samples whose members lie in blocks of memory handed over by their owner (Parquet row "
      "groups read by pyarrow): expect (or put) a block before submitting a batch that reads "
      "it, put or fail it once read, drop it once no batch in flight needs it.")
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
      .def("expect", &BlockSampleSource::expect, py::arg("block"),
           "Block `block` is being read: batches that read from it wait for it (on the "
           "engine's threads) until it is put or failed.")
      // With the GIL held: the buffers of a block it replaces, unless a
      // sample still points into them, are released here and now.
      .def(
          "fail",
          [](BlockSampleSource& source, size_t block, bool data, const std::string& message) {
            source.fail(block, Error(data ? ErrorKind::kData : ErrorKind::kIo, message, __FILE__,
                                     __LINE__));
          },
          py::arg("block"), py::arg("data"), py::arg("message"),
          "Block `block` cannot be read: each of its samples fails with DataError (`data`) or "
          "ReadError and `message` (which names the block), raised at its batch or skipped "
          "as the engine's error policy says.")
      .def("drop", &BlockSampleSource::drop, py::arg("block"))
      .def_property_readonly("blocks_held", &BlockSampleSource::blocks_held)
      .def_property_readonly("bytes_read", &BlockSampleSource::bytes_read,
                             "Payload bytes handed to the decoders so far.");
}

const BindingsFile kBlockSourceBindings{"_core", "block_source", {"indexed"},
                                        register_block_source};

}  // namespace chute::bindings

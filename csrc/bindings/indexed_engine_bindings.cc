// The engine that gathers batches by index, and the two kinds of source it
// reads: RowSource (rows of fixed shape, gathered by index) and
// IndexedSampleSource (samples read by id and decoded by the plan's fields).
// The concrete sources bind in files of their own (hdf5_bindings.cc,
// array_bindings.cc, tar_index_bindings.cc, block_source_bindings.cc), after
// this one; batches leave as zero-copy numpy arrays.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bindings/engine_face.h"
#include "bindings/errors.h"
#include "bindings/numpy_convert.h"
#include "bindings/pin_hooks.h"
#include "bindings/process_owned.h"
#include "bindings/registry.h"
#include "compose/catalog.h"
#include "compose/stream_request.h"
#include "core/error.h"
#include "engine/indexed_engine.h"

namespace py = pybind11;

namespace chute::bindings {

void register_indexed_engine(py::module_& m) {
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

  py::class_<IndexedSampleSource, std::shared_ptr<IndexedSampleSource>>(
      m, "IndexedSampleSource", "Samples read by id (sample mode of the IndexedEngine).")
      .def_property_readonly("num_samples", &IndexedSampleSource::num_samples);

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
            int64_t sequence = 0;
            std::exception_ptr failure;
            {
              // A daemon thread may submit to an engine that exit closed:
              // the error must not leave a scope that takes the GIL back.
              ReleasedGil released;
              try {
                sequence = e.submit(data, n, epoch);
              } catch (...) {
                failure = std::current_exception();
                // Exit closed it: the daemon thread stops here, as one
                // waiting in next() does, instead of raising at exit.
                park_if_left_running_at_exit();
              }
            }
            if (failure) std::rethrow_exception(failure);
            return sequence;
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
            // A failed gather's error must not leave a ReleasedGil scope.
            without_gil(
                [&] { engine.gather(idx.data(), static_cast<size_t>(idx.size()), &batch); });
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
          "set_active_threads",
          [](OwnedIndexedEngine& owned, int threads, int64_t in_flight) {
            // Not a call guard: the error of a forked copy (get) would leave it.
            without_gil([&] { owned.get().set_active_threads(threads, in_flight); });
          },
          py::arg("threads"), py::arg("in_flight"),
          "At most `threads` of the plan's threads gather from now on, with `in_flight` "
          "batches started ahead of the consumer; batches stay in submission order.")
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

const BindingsFile kIndexedEngineBindings{"_core", "indexed", {"batch", "stream"},
                                          register_indexed_engine};

}  // namespace chute::bindings

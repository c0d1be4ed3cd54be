#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bindings/block_columns.h"
#include "bindings/engine_face.h"
#include "bindings/owned_stream_engine.h"
#include "bindings/pin_hooks.h"
#include "bindings/registry.h"
#include "bindings/text.h"
#include "compose/stream_request.h"
#include "engine/stream_engine.h"
#include "io/fetch_queue.h"
#include "sources/block_feed.h"

namespace py = pybind11;

namespace chute::bindings {

namespace {

// Python sees one flat object per plan and per field; the attributes live in
// the request's parts (the generic plan, the byte-source options, the codec
// spec), so each is forwarded to the part that holds it, as def_readwrite
// would bind it (a bound struct such as `image` is returned by reference).
template <typename Outer, typename Part, typename T>
void forward(py::class_<Outer>& cls, const char* name, Part Outer::*part, T Part::*member) {
  cls.def_property(
      name,
      py::cpp_function([part, member](const Outer& o) -> const T& { return o.*part.*member; },
                       py::return_value_policy::reference_internal),
      [part, member](Outer& o, const T& value) { (o.*part).*member = value; });
}

}  // namespace

void register_stream(py::module_& m) {
  py::enum_<FieldCodec>(m, "FieldDecoder")
      .value("IMAGE", FieldCodec::kImage)
      .value("NPY", FieldCodec::kNpy)
      .value("INT", FieldCodec::kInt)
      .value("RAW", FieldCodec::kRaw);
  py::enum_<ColorMode>(m, "ColorMode").value("RGB", ColorMode::kRgb).value("GRAY", ColorMode::kGray);
  py::enum_<CropMode>(m, "CropMode")
      .value("NONE", CropMode::kNone)
      .value("CENTER", CropMode::kCenter)
      .value("RANDOM", CropMode::kRandom)
      .value("RANDOM_RESIZED", CropMode::kRandomResized);
  py::enum_<Layout>(m, "Layout").value("HWC", Layout::kHWC).value("CHW", Layout::kCHW);
  py::enum_<PixelType>(m, "PixelType")
      .value("UINT8", PixelType::kUint8)
      .value("FLOAT32", PixelType::kFloat32)
      .value("FLOAT16", PixelType::kFloat16)
      .value("BFLOAT16", PixelType::kBFloat16);
  py::enum_<ErrorPolicy>(m, "ErrorPolicy").value("RAISE", ErrorPolicy::kRaise).value("SKIP", ErrorPolicy::kSkip);

  py::class_<ImageOutputSpec>(m, "ImageOutputSpec")
      .def(py::init<>())
      .def_readwrite("layout", &ImageOutputSpec::layout)
      .def_readwrite("dtype", &ImageOutputSpec::dtype)
      .def_readwrite("squeeze_gray", &ImageOutputSpec::squeeze_gray)
      .def_readwrite("out_height", &ImageOutputSpec::out_height)
      .def_readwrite("out_width", &ImageOutputSpec::out_width)
      .def_readwrite("resize", &ImageOutputSpec::resize)
      .def_readwrite("crop", &ImageOutputSpec::crop)
      .def_readwrite("scale_min", &ImageOutputSpec::scale_min)
      .def_readwrite("scale_max", &ImageOutputSpec::scale_max)
      .def_readwrite("ratio_min", &ImageOutputSpec::ratio_min)
      .def_readwrite("ratio_max", &ImageOutputSpec::ratio_max)
      .def_readwrite("random_flip", &ImageOutputSpec::random_flip)
      .def_readwrite("normalize", &ImageOutputSpec::normalize)
      .def_readwrite("mean", &ImageOutputSpec::mean)
      .def_readwrite("std", &ImageOutputSpec::std);

  py::class_<FieldRequest> field(m, "FieldPlan");
  field.def(py::init<>());
  // Names and extensions come from member names (surrogateescape str, see text.h).
  field.def_property(
      "name", [](const FieldRequest& r) { return name_text(r.field.name); },
      [](FieldRequest& r, const py::str& value) { r.field.name = name_bytes(value); });
  field.def_property(
      "extensions", [](const FieldRequest& r) { return name_list(r.field.extensions); },
      [](FieldRequest& r, const py::typing::Iterable<py::str>& values) {
        r.field.extensions = name_bytes_list(values);
      });
  forward(field, "decoder", &FieldRequest::codec, &FieldCodecSpec::codec);
  forward(field, "color", &FieldRequest::codec, &FieldCodecSpec::color);
  forward(field, "image", &FieldRequest::codec, &FieldCodecSpec::image);
  forward(field, "optional", &FieldRequest::field, &FieldPlan::optional);
  forward(field, "stack", &FieldRequest::field, &FieldPlan::stack);

  py::class_<BlockFeed, std::shared_ptr<BlockFeed>>(
      m, "BlockFeed",
      "Stream shards of one block each (Parquet row groups), read by their owner on "
      "request: the engine opens a url, the owner takes the request (next_request), reads "
      "the block and puts it, or fails it.")
      .def(py::init<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>,
                    std::vector<int64_t>, std::vector<std::string>, std::vector<int64_t>,
                    std::vector<std::string>>(),
           py::arg("extensions"), py::arg("column_names"), py::arg("urls"), py::arg("rows"),
           py::arg("names"), py::arg("first_keys"), py::arg("files"))
      .def(
          "next_request",
          [](const BlockFeed& feed,
             std::optional<double> timeout) -> std::optional<std::tuple<uint64_t, size_t>> {
            std::optional<BlockFeed::Request> request;
            {
              // A reader thread (a daemon) may wait here when Python exits.
              ReleasedGil released;
              request = feed.next_request(timeout);
            }
            if (!request) return std::nullopt;
            return std::make_tuple(request->ticket, request->block);
          },
          py::arg("timeout") = py::none(),
          "(ticket, block) of the oldest request not yet taken, or None after `timeout` "
          "seconds or once closed (without a timeout, None only once closed).")
      .def(
          "put",
          [](const BlockFeed& feed, uint64_t ticket, size_t block,
             const std::vector<BlockColumnArgs>& columns) {
            py::list held;
            std::vector<BlockColumn> out = block_columns(
                columns, feed.block_rows(block), "block " + std::to_string(block), held);
            std::shared_ptr<void> owner = keep_python_alive(std::move(held));
            std::exception_ptr failure;
            {
              ReleasedGil released;  // never left by an exception (engine_face.h)
              try {
                feed.put(ticket, std::move(out), std::move(owner));
              } catch (...) {
                failure = std::current_exception();
              }
            }
            if (failure) std::rethrow_exception(failure);
            // A ticket whose source is gone dropped the block's owner.
            release_dropped_python_objects();
          },
          py::arg("ticket"), py::arg("block"), py::arg("columns"),
          "Request `ticket`'s block (`block`): one (data buffer, int64 offsets, uint8 present or "
          "None) per extension, used in place and kept alive.")
      .def(
          "fail",
          [](const BlockFeed& feed, uint64_t ticket, bool data, const std::string& message) {
            feed.fail(ticket, Error(data ? ErrorKind::kData : ErrorKind::kIo, message, __FILE__,
                                    __LINE__));
          },
          py::arg("ticket"), py::arg("data"), py::arg("message"),
          "Request `ticket`'s block cannot be read: its source raises DataError (`data`) or "
          "ReadError with `message`.")
      .def("close", &BlockFeed::close, py::call_guard<ReleasedGil>())
      .def_property_readonly("bytes_read", &BlockFeed::bytes_read);

  py::class_<StreamRequest> plan(m, "StreamPlan");
  plan.def(py::init<>());
  forward(plan, "urls", &StreamRequest::plan, &StreamPlan::urls);
  forward(plan, "sample_ranges", &StreamRequest::plan, &StreamPlan::sample_ranges);
  forward(plan, "cache_dir", &StreamRequest::source, &SourceOptions::cache_dir);
  forward(plan, "pipe_timeout", &StreamRequest::source, &SourceOptions::pipe_timeout_s);
  forward(plan, "readahead_bytes", &StreamRequest::source, &SourceOptions::readahead_bytes);
  forward(plan, "cache_limit_bytes", &StreamRequest::source, &SourceOptions::cache_limit_bytes);
  forward(plan, "cache_fsync", &StreamRequest::source, &SourceOptions::cache_fsync);
  forward(plan, "remote", &StreamRequest::source, &SourceOptions::remote);
  plan.def_readwrite("fields", &StreamRequest::fields);
  forward(plan, "keep_other_members", &StreamRequest::plan, &StreamPlan::keep_other_members);
  forward(plan, "collect_keys", &StreamRequest::plan, &StreamPlan::collect_keys);
  forward(plan, "num_streams", &StreamRequest::plan, &StreamPlan::num_streams);
  forward(plan, "num_threads", &StreamRequest::plan, &StreamPlan::num_threads);
  forward(plan, "parse_ahead", &StreamRequest::plan, &StreamPlan::parse_ahead);
  forward(plan, "prefetch_batches", &StreamRequest::plan, &StreamPlan::prefetch_batches);
  forward(plan, "max_inflight_bytes", &StreamRequest::plan, &StreamPlan::max_inflight_bytes);
  forward(plan, "max_batch_bytes", &StreamRequest::plan, &StreamPlan::max_batch_bytes);
  forward(plan, "samples_one_by_one", &StreamRequest::plan, &StreamPlan::samples_one_by_one);
  forward(plan, "resampled", &StreamRequest::plan, &StreamPlan::resampled);
  forward(plan, "shuffle_shards", &StreamRequest::plan, &StreamPlan::shuffle_shards);
  forward(plan, "repeat", &StreamRequest::plan, &StreamPlan::repeat);
  forward(plan, "shuffle_capacity", &StreamRequest::plan, &StreamPlan::shuffle_capacity);
  forward(plan, "shuffle_initial", &StreamRequest::plan, &StreamPlan::shuffle_initial);
  forward(plan, "shuffle_max_bytes", &StreamRequest::plan, &StreamPlan::shuffle_max_bytes);
  forward(plan, "seed", &StreamRequest::plan, &StreamPlan::seed);
  forward(plan, "epoch", &StreamRequest::plan, &StreamPlan::epoch);
  forward(plan, "batch_size", &StreamRequest::plan, &StreamPlan::batch_size);
  forward(plan, "partial", &StreamRequest::plan, &StreamPlan::partial);
  forward(plan, "max_batches", &StreamRequest::plan, &StreamPlan::max_batches);
  forward(plan, "max_samples", &StreamRequest::plan, &StreamPlan::max_samples);
  forward(plan, "repeat_to_limit", &StreamRequest::plan, &StreamPlan::repeat_to_limit);
  forward(plan, "skip_batches", &StreamRequest::plan, &StreamPlan::skip_batches);
  forward(plan, "deliver_stride", &StreamRequest::plan, &StreamPlan::deliver_stride);
  forward(plan, "deliver_offset", &StreamRequest::plan, &StreamPlan::deliver_offset);
  plan.def(
      "set_pin_hooks",
      [](StreamRequest& r, uintptr_t register_fn, uintptr_t unregister_fn) {
        r.plan.pin = pin_hooks_from_addresses(register_fn, unregister_fn);
      },
      py::arg("register_fn"), py::arg("unregister_fn"),
      "Addresses of cudaHostRegister/cudaHostUnregister (see chute.gpu.pinning).");
  forward(plan, "on_error", &StreamRequest::plan, &StreamPlan::on_error);
  plan.def_property(
      "block_feed",
      [](const StreamRequest& r) {
        return std::const_pointer_cast<BlockFeed>(
            std::dynamic_pointer_cast<const BlockFeed>(r.sources));
      },
      [](StreamRequest& r, std::shared_ptr<BlockFeed> feed) { r.sources = std::move(feed); },
      "The BlockFeed that reads the urls (row groups), or None: the catalog picks the "
      "source by url.");


  py::class_<OwnedStreamEngine>(m, "StreamEngine")
      .def(py::init([](const StreamRequest& request) {
             // The GIL is released inside the factory, not by a call guard:
             // pybind11 registers the new instance in its GIL-guarded
             // tables after the factory returns, still within the call.
             std::unique_ptr<OwnedStreamEngine> made;
             std::exception_ptr failure;
             {
               ReleasedGil released;
               try {
                 StreamRequest counted = request;
                 auto counters = std::make_shared<SourceCounters>();
                 counted.source.counters = counters;
                 made = std::make_unique<OwnedStreamEngine>(
                     std::make_unique<StreamEngine>(compose_stream_plan(counted)), counters);
               } catch (...) {
                 failure = std::current_exception();
               }
             }
             if (failure) std::rethrow_exception(failure);
             return made;
           }),
           py::arg("plan"))
      .def(
          "next",
          [](OwnedStreamEngine& owned, double timeout) {
            StreamEngine& engine = owned.get();
            return wait_for_batch(
                [&](Batch* out, double slice) { return engine.next(out, slice); }, timeout);
          },
          py::arg("timeout") = 0.0,
          "Next batch; None at the end of the epoch. Raises TimeoutError when `timeout` "
          "seconds (0: wait forever) pass first, and the error of a failed batch at its "
          "position.")
      .def("close", &OwnedStreamEngine::close,
           "Stops the threads and drops what is queued; nothing in a forked copy.")
      .def("stats", [](const OwnedStreamEngine& owned) { return stats_dict(owned.stats()); })
      .def(
          "set_active_threads",
          [](OwnedStreamEngine& owned, int threads, int64_t in_flight) {
            // Not a call guard: the error of a forked copy (get) would leave it.
            without_gil([&] { owned.get().set_active_threads(threads, in_flight); });
          },
          py::arg("threads"), py::arg("in_flight"),
          "At most `threads` of the plan's decode threads work from now on, with `in_flight` "
          "batches in flight; the batches and their order are the plan's whatever the count.")
      .def(
          "batches_formed",
          [](const OwnedStreamEngine& owned) {
            return owned.here() ? owned.get().batches_formed() : int64_t{0};
          },
          "Batches formed so far, those skipped by a resume included; at the end of the "
          "epoch, its batch count.");
}

const BindingsFile kStreamBindings{"_core", "stream", {"batch", "remote"}, register_stream};

}  // namespace chute::bindings

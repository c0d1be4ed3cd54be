#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>

#include "bindings/pin_hooks.h"
#include "bindings/registry.h"
#include "core/error.h"
#include "pipeline/stream_engine.h"

namespace py = pybind11;

namespace chute::bindings {

namespace {

py::dict stats_to_dict(const StreamStats& s) {
  py::dict d;
  d["shards_opened"] = s.shards_opened;
  d["samples_read"] = s.samples_read;
  d["samples_skipped"] = s.samples_skipped;
  d["samples_batched"] = s.samples_batched;
  d["batches"] = s.batches;
  d["samples_yielded"] = s.samples_yielded;
  d["encoded_bytes"] = s.encoded_bytes;
  d["read_seconds"] = static_cast<double>(s.read_ns) * 1e-9;
  d["decode_seconds"] = static_cast<double>(s.decode_ns) * 1e-9;
  d["shuffle_bytes"] = s.shuffle_bytes;
  d["shuffle_peak_bytes"] = s.shuffle_peak_bytes;
  d["shuffle_peak_samples"] = s.shuffle_peak_samples;
  d["queued_batches"] = s.queued_batches;
  d["arenas_created"] = s.memory.arenas_created;
  d["batch_bytes_reserved"] = s.memory.bytes_reserved;
  d["batch_bytes_in_use"] = s.memory.bytes_in_use;
  d["batch_peak_bytes_reserved"] = s.memory.peak_bytes_reserved;
  d["batch_peak_bytes_in_use"] = s.memory.peak_bytes_in_use;
  d["batch_bytes_pinned"] = s.memory.bytes_pinned;
  return d;
}

}  // namespace

void register_stream(py::module_& m) {
  m.def(
      "peek_tar_sample",
      [](const std::string& url, const std::string& cache_dir, double pipe_timeout) -> py::object {
        std::vector<std::string> extensions;
        bool found = false;
        {
          py::gil_scoped_release release;
          SourceOptions options;
          options.cache_dir = cache_dir;
          options.pipe_timeout_s = pipe_timeout;
          SampleReader reader(open_source(url, options), 0);
          EncodedSample sample;
          found = reader.next(sample);
          for (const SampleMember& m : sample.members) extensions.push_back(m.extension);
        }
        if (!found) return py::none();
        return py::cast(extensions);
      },
      py::arg("url"), py::arg("cache_dir") = "", py::arg("pipe_timeout") = 0.0,
      "Member extensions of the first sample of a shard, or None for an empty shard.");

  py::enum_<FieldDecoder>(m, "FieldDecoder")
      .value("IMAGE", FieldDecoder::kImage)
      .value("NPY", FieldDecoder::kNpy)
      .value("INT", FieldDecoder::kInt)
      .value("RAW", FieldDecoder::kRaw);
  py::enum_<ColorMode>(m, "ColorMode").value("RGB", ColorMode::kRgb).value("GRAY", ColorMode::kGray);
  py::enum_<CropMode>(m, "CropMode")
      .value("NONE", CropMode::kNone)
      .value("CENTER", CropMode::kCenter)
      .value("RANDOM", CropMode::kRandom);
  py::enum_<ErrorPolicy>(m, "ErrorPolicy").value("RAISE", ErrorPolicy::kRaise).value("SKIP", ErrorPolicy::kSkip);

  py::class_<ImageOutputSpec>(m, "ImageOutputSpec")
      .def(py::init<>())
      .def_readwrite("chw", &ImageOutputSpec::chw)
      .def_readwrite("to_float", &ImageOutputSpec::to_float)
      .def_readwrite("squeeze_gray", &ImageOutputSpec::squeeze_gray)
      .def_readwrite("out_height", &ImageOutputSpec::out_height)
      .def_readwrite("out_width", &ImageOutputSpec::out_width)
      .def_readwrite("crop", &ImageOutputSpec::crop)
      .def_readwrite("random_flip", &ImageOutputSpec::random_flip);

  py::class_<FieldPlan>(m, "FieldPlan")
      .def(py::init<>())
      .def_readwrite("name", &FieldPlan::name)
      .def_readwrite("extensions", &FieldPlan::extensions)
      .def_readwrite("decoder", &FieldPlan::decoder)
      .def_readwrite("color", &FieldPlan::color)
      .def_readwrite("image", &FieldPlan::image)
      .def_readwrite("optional", &FieldPlan::optional)
      .def_readwrite("stack", &FieldPlan::stack);

  py::class_<StreamPlan>(m, "StreamPlan")
      .def(py::init<>())
      .def_readwrite("urls", &StreamPlan::urls)
      .def_property(
          "cache_dir", [](const StreamPlan& p) { return p.source.cache_dir; },
          [](StreamPlan& p, const std::string& v) { p.source.cache_dir = v; })
      .def_property(
          "pipe_timeout", [](const StreamPlan& p) { return p.source.pipe_timeout_s; },
          [](StreamPlan& p, double v) { p.source.pipe_timeout_s = v; })
      .def_property(
          "readahead_bytes", [](const StreamPlan& p) { return p.source.readahead_bytes; },
          [](StreamPlan& p, size_t v) { p.source.readahead_bytes = v; })
      .def_readwrite("fields", &StreamPlan::fields)
      .def_readwrite("keep_other_members", &StreamPlan::keep_other_members)
      .def_readwrite("collect_keys", &StreamPlan::collect_keys)
      .def_readwrite("num_streams", &StreamPlan::num_streams)
      .def_readwrite("num_threads", &StreamPlan::num_threads)
      .def_readwrite("parse_ahead", &StreamPlan::parse_ahead)
      .def_readwrite("prefetch_batches", &StreamPlan::prefetch_batches)
      .def_readwrite("resampled", &StreamPlan::resampled)
      .def_readwrite("shuffle_shards", &StreamPlan::shuffle_shards)
      .def_readwrite("repeat", &StreamPlan::repeat)
      .def_readwrite("shuffle_capacity", &StreamPlan::shuffle_capacity)
      .def_readwrite("shuffle_initial", &StreamPlan::shuffle_initial)
      .def_readwrite("shuffle_max_bytes", &StreamPlan::shuffle_max_bytes)
      .def_readwrite("seed", &StreamPlan::seed)
      .def_readwrite("epoch", &StreamPlan::epoch)
      .def_readwrite("batch_size", &StreamPlan::batch_size)
      .def_readwrite("partial", &StreamPlan::partial)
      .def_readwrite("max_batches", &StreamPlan::max_batches)
      .def_readwrite("skip_batches", &StreamPlan::skip_batches)
      .def(
          "set_pin_hooks",
          [](StreamPlan& p, uintptr_t register_fn, uintptr_t unregister_fn) {
            p.pin = pin_hooks_from_addresses(register_fn, unregister_fn);
          },
          py::arg("register_fn"), py::arg("unregister_fn"),
          "Addresses of cudaHostRegister/cudaHostUnregister (see chute.pinning).")
      .def_readwrite("on_error", &StreamPlan::on_error);

  py::class_<StreamEngine>(m, "StreamEngine")
      .def(py::init<StreamPlan>(), py::call_guard<py::gil_scoped_release>())
      .def(
          "next",
          [](StreamEngine& engine, double timeout) -> py::object {
            auto batch = std::make_unique<Batch>();
            OrderedResults::Status status;
            // A wait with the GIL released is deaf to Ctrl-C: wait in short
            // slices and let Python run its signal handlers between them.
            const auto start = std::chrono::steady_clock::now();
            for (;;) {
              double slice = 0.1;
              if (timeout > 0) {
                const double left =
                    timeout - std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                                  .count();
                if (left <= 0) {
                  status = OrderedResults::Status::kTimeout;
                  break;
                }
                slice = std::min(slice, left);
              }
              {
                py::gil_scoped_release release;
                status = engine.next(batch.get(), slice);
              }
              if (status != OrderedResults::Status::kTimeout) break;
              if (PyErr_CheckSignals() != 0) throw py::error_already_set();
            }
            switch (status) {
              case OrderedResults::Status::kBatch:
                return py::cast(std::move(batch));
              case OrderedResults::Status::kTimeout:
                return py::bool_(false);
              case OrderedResults::Status::kEnd:
              case OrderedResults::Status::kClosed:
                return py::none();
            }
            return py::none();
          },
          py::arg("timeout") = 0.0,
          "Next batch; None at the end of the epoch; False when `timeout` seconds (0: wait "
          "forever) pass first. Raises the error of a failed batch at its position.")
      .def("close", &StreamEngine::close, py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const StreamEngine& e) { return stats_to_dict(e.stats()); })
      .def("take_skip_messages", &StreamEngine::take_skip_messages);
}

}  // namespace chute::bindings

#include "bindings/engine_face.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>

namespace py = pybind11;

namespace chute::bindings {
namespace {

// How long one native wait lasts before Python's signal handlers get a turn.
constexpr double kWaitSliceS = 0.1;

}  // namespace

py::object wait_for_batch(const std::function<OrderedResults::Status(Batch*, double)>& next,
                          double timeout_s) {
  auto batch = std::make_unique<Batch>();
  OrderedResults::Status status;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    double slice = kWaitSliceS;
    if (timeout_s > 0) {
      const double left =
          timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (left <= 0) {
        std::ostringstream os;
        os << "no batch within " << timeout_s << " seconds";
        py::set_error(PyExc_TimeoutError, os.str().c_str());
        throw py::error_already_set();
      }
      slice = std::min(slice, left);
    }
    {
      py::gil_scoped_release release;
      status = next(batch.get(), slice);
    }
    if (status != OrderedResults::Status::kTimeout) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  if (status == OrderedResults::Status::kBatch) return py::cast(std::move(batch));
  return py::none();
}

py::dict stats_dict(const EngineStats& s) {
  py::dict d;
  d["batches"] = s.batches;
  d["samples_yielded"] = s.samples_yielded;
  d["bytes_yielded"] = s.bytes_yielded;
  d["batches_submitted"] = s.batches_submitted;
  d["queued_batches"] = s.queued_batches;
  d["samples_read"] = s.samples_read;
  d["samples_skipped"] = s.samples_skipped;
  d["samples_batched"] = s.samples_batched;
  d["shards_opened"] = s.shards_opened;
  d["encoded_bytes"] = s.encoded_bytes;
  d["read_seconds"] = static_cast<double>(s.read_ns) * 1e-9;
  d["decode_seconds"] = static_cast<double>(s.decode_ns) * 1e-9;
  d["shuffle_bytes"] = s.shuffle_bytes;
  d["shuffle_peak_bytes"] = s.shuffle_peak_bytes;
  d["shuffle_peak_samples"] = s.shuffle_peak_samples;
  d["cache_corrupt_refetches"] = s.cache_corrupt_refetches;
  d["arenas_created"] = s.memory.arenas_created;
  d["batch_bytes_reserved"] = s.memory.bytes_reserved;
  d["batch_bytes_in_use"] = s.memory.bytes_in_use;
  d["batch_peak_bytes_reserved"] = s.memory.peak_bytes_reserved;
  d["batch_peak_bytes_in_use"] = s.memory.peak_bytes_in_use;
  d["batch_bytes_pinned"] = s.memory.bytes_pinned;
  return d;
}

}  // namespace chute::bindings

// What elastic resume and weighted mixing ask of the engine from Python: the
// replay of a stream's shuffle buffer on sample positions, and the order in
// which a weighted mix takes its sources.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bindings/registry.h"
#include "schedule/mix_schedule.h"
#include "schedule/shuffle_replay.h"

namespace py = pybind11;

namespace chute::bindings {

namespace {

template <typename T>
py::array_t<T> to_numpy(const std::vector<T>& values) {
  py::array_t<T> out(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

py::array_t<int64_t> replay_shuffle_py(
    size_t capacity, size_t initial, size_t max_bytes, uint64_t plan_seed, int64_t epoch,
    uint64_t stream, const py::array_t<uint64_t, py::array::c_style | py::array::forcecast>& bytes,
    size_t outputs) {
  ShuffleReplaySpec spec;
  spec.capacity = capacity;
  spec.initial = initial;
  spec.max_bytes = max_bytes;
  spec.plan_seed = plan_seed;
  spec.epoch = epoch;
  spec.stream = stream;
  const std::vector<uint64_t> sizes(bytes.data(), bytes.data() + bytes.size());
  std::vector<int64_t> order;
  {
    py::gil_scoped_release release;
    order = replay_shuffle(spec, sizes, outputs);
  }
  return to_numpy(order);
}

py::array_t<int32_t> mix_schedule_py(const std::vector<int64_t>& counts, int64_t begin,
                                     int64_t end) {
  std::vector<int32_t> sources;
  {
    py::gil_scoped_release release;
    sources = mix_schedule(counts, begin, end);
  }
  return to_numpy(sources);
}

}  // namespace

void register_elastic(py::module_& m) {
  m.def("replay_shuffle", &replay_shuffle_py, py::arg("capacity"), py::arg("initial"),
        py::arg("max_bytes"), py::arg("plan_seed"), py::arg("epoch"), py::arg("stream"),
        py::arg("bytes"), py::arg("outputs"),
        "Positions (into `bytes`, the encoded size of each sample a stream reads, in order) of "
        "the first `outputs` samples its shuffle buffer lets out, in the order they leave: the "
        "engine's own buffer (StreamPlan shuffle settings and seed), replayed.");
  m.def("mix_schedule", &mix_schedule_py, py::arg("counts"), py::arg("begin"), py::arg("end"),
        "The source (an index into `counts`) of each position in [begin, end) of a mix that "
        "takes counts[i] of every sum(counts) positions from source i, each prefix of a period "
        "within one position of its share (Tijdeman's chairman assignment).");
}

const BindingsFile kElasticBindings{"_core", "elastic", {}, register_elastic};

}  // namespace chute::bindings

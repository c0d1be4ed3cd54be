// chute_testing: the entry points that only the tests and benchmarks call,
// as an extension module of its own that the wheel does not ship (built
// with -DCHUTE_TESTING_MODULE=ON: scripts/dev_build.sh, sanitize.sh and
// test.sh). It links its own copy of the engine's libraries, so a setting
// made through chute._core (set_max_image_pixels) does not reach it; errors
// are raised as chute._core's classes (DataError, ReadError, ...), whose
// translator _core registers for every module built with the same pybind11.
#include <fcntl.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bindings/image_arguments.h"
#include "bindings/registry.h"
#include "core/error.h"
#include "decode/image_decoder.h"
#include "io/mapped_region.h"
#include "io/unique_fd.h"
#include "tokens/token_file.h"

namespace py = pybind11;

namespace chute::bindings {
namespace {

// Bytes [offset, offset + size) of a file, copied through the guarded
// mapping path that contiguous HDF5 rows take.
py::bytes mapped_read_py(const std::string& path, uint64_t offset, size_t size) {
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
}

// Copies the windows of `window_bytes` at `starts` (byte offsets) of a
// token file into one reused batch buffer of `batch` windows, on this
// thread, with the GIL released; returns the seconds taken. The token
// benchmark's limit: the bytes of the same windows moved by memcpy alone.
double memcpy_windows_py(
    const std::shared_ptr<TokenFile>& file,
    const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& starts,
    int64_t window_bytes, int64_t batch) {
  CHUTE_CHECK(window_bytes > 0 && batch > 0, kUsage, "window_bytes and batch must be positive");
  const int64_t* at = starts.data();
  const auto n = static_cast<size_t>(starts.size());
  for (size_t i = 0; i < n; ++i) {
    CHUTE_CHECK(at[i] >= 0 && static_cast<uint64_t>(at[i] + window_bytes) <= file->size(), kUsage,
                "window at byte " << at[i] << " is past the end of '" << file->path() << "'");
  }
  py::gil_scoped_release release;
  std::vector<uint8_t> out(static_cast<size_t>(window_bytes * batch));
  const uint8_t* data = file->data();
  const auto begin = std::chrono::steady_clock::now();
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(out.data() + (i % static_cast<size_t>(batch)) * static_cast<size_t>(window_bytes),
                data + at[i], static_cast<size_t>(window_bytes));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

}  // namespace
}  // namespace chute::bindings

PYBIND11_MODULE(chute_testing, m) {
  namespace bindings = chute::bindings;
  m.doc() = "chute's test-only entry points (not part of the wheel)";
  // Its types (ImageOutputSpec, ColorMode); its error classes, which errors.cc adopts.
  py::module_::import("chute._core");
  bindings::define_registered_bindings(m, "chute_testing");
  m.def("mapped_read", &bindings::mapped_read_py, py::arg("path"), py::arg("offset"),
        py::arg("size"),
        "Bytes [offset, offset + size) of a file copied through the guarded mapping path that "
        "contiguous HDF5 rows take; a range past the end of the file raises ReadError instead "
        "of killing the process with SIGBUS.");
  m.def("memcpy_windows", &bindings::memcpy_windows_py, py::arg("file"), py::arg("starts"),
        py::arg("window_bytes"), py::arg("batch"),
        "Seconds to memcpy the windows at byte offsets `starts` of `file` into one reused "
        "buffer of `batch` windows, on one thread (the token benchmark's limit).");
}

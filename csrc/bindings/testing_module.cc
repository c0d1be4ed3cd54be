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
#include "decode/jpeg_decoder.h"
#include "io/mapped_region.h"
#include "io/unique_fd.h"
#include "tokens/token_file.h"

namespace py = pybind11;

namespace chute::bindings {
namespace {

// Decodes the images in turn, again and again, into one reused buffer until
// `seconds` have passed; returns images per second. The benchmarks' decode
// limit: the codec's own rate on one thread, with no Python and no
// allocation between images.
double decode_loop_py(const py::list& images, double seconds, const std::string& mode_name,
                      bool entropy_only) {
  const ColorMode mode = parse_mode(mode_name);
  // Our own references: the list may change while the GIL is released.
  std::vector<py::bytes> held;
  std::vector<Bytes> inputs;
  for (const py::handle& item : images) {
    held.push_back(item.cast<py::bytes>());
    inputs.push_back(view(held.back()));
  }
  CHUTE_CHECK(!inputs.empty(), kUsage, "decode_loop needs at least one image");
  py::gil_scoped_release release;
  std::vector<uint8_t> out;
  for (const Bytes& in : inputs) {
    const ImageInfo info = probe_image(in.data, in.size, "<bytes>");
    CHUTE_CHECK(!entropy_only || std::strcmp(info.format, "jpeg") == 0, kUsage,
                "decode_loop(entropy_only=True) takes JPEGs only");
    const size_t bytes = static_cast<size_t>(info.height) * info.width * 3;
    if (bytes > out.size()) out.resize(bytes);
  }
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  uint64_t done = 0;
  do {
    for (const Bytes& in : inputs) {
      if (entropy_only) {
        detail::entropy_decode_jpeg(in.data, in.size, "<bytes>");
      } else {
        decode_image(in.data, in.size, mode, out.data(), "<bytes>");
      }
    }
    done += inputs.size();
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < seconds);
  return static_cast<double>(done) / elapsed;
}

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
  // Its types (ImageOutputSpec, ColorMode) and its error translator.
  py::module_::import("chute._core");
  bindings::register_testing_image(m);
  m.def("decode_loop", &bindings::decode_loop_py, py::arg("images"), py::arg("seconds"),
        py::arg("mode") = "rgb", py::arg("entropy_only") = false,
        "Decode the images in turn into one buffer, on this thread with the GIL released, "
        "until `seconds` pass; images per second. entropy_only (JPEGs): decode the "
        "coefficients only, the part of a decode that region decoding cannot skip.");
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

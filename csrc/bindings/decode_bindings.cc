// Single-sample entry points to the decoders that the package itself calls
// (`chute inspect`, the image size limit, `chute bench --decode-limit`). The
// engine calls the decoders natively; a whole decode and the resampler one
// image at a time are the tests' (testing_image.cc).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bindings/image_arguments.h"
#include "bindings/numpy_convert.h"
#include "bindings/registry.h"
#include "core/error.h"
#include "decode/image_decoder.h"
#include "decode/jpeg_decoder.h"
#include "decode/label.h"
#include "decode/npy.h"

namespace py = pybind11;

namespace chute::bindings {
namespace {

py::tuple probe_image_py(const py::bytes& data, const std::string& where) {
  const Bytes in = view(data);
  ImageInfo info;
  {
    py::gil_scoped_release release;
    info = probe_image(in.data, in.size, where);
  }
  return py::make_tuple(info.format, info.width, info.height);
}

py::array decode_npy_py(const py::bytes& data, const std::string& where) {
  const Bytes in = view(data);
  NpyHeader header;
  {
    py::gil_scoped_release release;
    header = parse_npy_header(in.data, in.size, where);
  }
  std::vector<py::ssize_t> shape(header.shape.begin(), header.shape.end());
  py::array out(header.descr.empty() ? numpy_dtype(header.dtype) : numpy_dtype(header.descr), shape);
  auto* dst = static_cast<uint8_t*>(out.mutable_data());
  {
    py::gil_scoped_release release;
    copy_npy(header, in.data, dst);
  }
  return out;
}

int64_t parse_int_label_py(const py::bytes& data, const std::string& where) {
  // Keeps the GIL: parsing a few bytes costs less than releasing and
  // re-taking it.
  const Bytes in = view(data);
  return parse_int_label(in.data, in.size, where);
}

// Decodes the images in turn, again and again, into one reused buffer until
// `seconds` have passed; returns images per second. The benchmarks' decode
// limit: the codec's own rate on one thread, with no Python and no
// allocation between images (`chute bench --decode-limit`, the demo's
// benchmarks).
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

}  // namespace

void register_decode(py::module_& m) {
  py::class_<ImageFormat>(m, "ImageFormat",
                          "An image format the engine decodes (csrc/decode/image_decoder.cc).")
      .def_readonly("name", &ImageFormat::name, "As probe_image names it: 'jpeg'.")
      .def_readonly("title", &ImageFormat::title, "As messages name it: 'JPEG'.")
      .def_readonly("extensions", &ImageFormat::extensions,
                    "The member extensions decoded natively as this format.")
      .def_readonly("region_decode", &ImageFormat::region_decode,
                    "Whether a resize decodes only around its crop.");
  m.def("image_formats", &image_formats,
        "The image formats the engine decodes natively: the one table of them.");
  m.def("probe_image", &probe_image_py, py::arg("data"), py::arg("where") = "<bytes>",
        "(format, width, height) from the image header alone.");
  m.def(
      "set_max_image_pixels",
      [](std::optional<int64_t> pixels) {
        CHUTE_CHECK(!pixels || *pixels > 0, kUsage,
                    "max image pixels must be positive, or None for no limit");
        set_max_image_pixels(pixels ? *pixels : 0);
      },
      py::arg("pixels"),
      "Images of more pixels are refused from their header (a decompression bomb guard); "
      "None: no limit.");
  m.def(
      "max_image_pixels",
      []() -> std::optional<int64_t> {
        const int64_t limit = max_image_pixels();
        if (limit <= 0) return std::nullopt;
        return limit;
      },
      "The decompression bomb guard's limit in pixels; None when there is none.");
  m.def("decode_npy", &decode_npy_py, py::arg("data"), py::arg("where") = "<bytes>",
        "Decode .npy bytes to a C-contiguous array as np.load reads them (the numeric dtypes "
        "in native byte order).");
  m.def("parse_int_label", &parse_int_label_py, py::arg("data"), py::arg("where") = "<bytes>",
        "Python's int(bytes), limited to int64.");
  m.def("decode_loop", &decode_loop_py, py::arg("images"), py::arg("seconds"),
        py::arg("mode") = "rgb", py::arg("entropy_only") = false,
        "Decode the images in turn into one buffer, on this thread with the GIL released, "
        "until `seconds` pass; images per second. entropy_only (JPEGs): decode the "
        "coefficients only, the part of a decode that region decoding cannot skip.");
}

const BindingsFile kDecodeBindings{"_core", "decode", {"stream"}, register_decode};

}  // namespace chute::bindings

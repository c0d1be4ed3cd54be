// Single-sample entry points to the decoders: what the tests and the
// per-sample slow path use. The engine itself calls the decoders natively.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings/image_arguments.h"
#include "bindings/numpy_convert.h"
#include "bindings/registry.h"
#include "core/error.h"
#include "core/random.h"
#include "decode/image_decoder.h"
#include "decode/label.h"
#include "decode/npy.h"
#include "image/output_spec.h"
#include "image/pixel_format.h"
#include "image/resample.h"

namespace py = pybind11;

namespace chute::bindings {
namespace {

py::array decode_image_py(const py::bytes& data, const std::string& mode_name,
                          const std::string& where) {
  const ColorMode mode = parse_mode(mode_name);
  const Bytes in = view(data);
  ImageInfo info;
  {
    py::gil_scoped_release release;
    info = probe_image(in.data, in.size, where);
  }
  py::array_t<uint8_t> out =
      mode == ColorMode::kRgb
          ? py::array_t<uint8_t>(std::vector<py::ssize_t>{info.height, info.width, 3})
          : py::array_t<uint8_t>(std::vector<py::ssize_t>{info.height, info.width});
  uint8_t* dst = out.mutable_data();
  {
    py::gil_scoped_release release;
    decode_image(in.data, in.size, mode, dst, where);
  }
  return std::move(out);
}

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

// Resize (covering the output for "center", exactly for "none"), crop, flip
// and lay out one image: the engine's per-image placement and resampler, for
// tests.
py::array transform_image_py(
    const py::array_t<uint8_t, py::array::c_style | py::array::forcecast>& hwc, int out_h,
    int out_w, const std::string& crop, bool flip, bool chw, bool to_float) {
  CHUTE_CHECK(hwc.ndim() == 2 || (hwc.ndim() == 3 && (hwc.shape(2) == 1 || hwc.shape(2) == 3)),
              kUsage, "transform_image expects an HW or HWC (C = 1 or 3) uint8 array");
  CHUTE_CHECK(crop == "center" || crop == "none", kUsage,
              "crop must be 'center' or 'none', not '" << crop << "'");
  const int h = static_cast<int>(hwc.shape(0));
  const int w = static_cast<int>(hwc.shape(1));
  const int channels = hwc.ndim() == 3 ? static_cast<int>(hwc.shape(2)) : 1;
  CHUTE_CHECK(h > 0 && w > 0, kUsage, "transform_image of an empty image");
  ImageOutputSpec spec;
  spec.layout = chw ? Layout::kCHW : Layout::kHWC;
  spec.dtype = to_float ? PixelType::kFloat32 : PixelType::kUint8;
  spec.out_height = out_h;
  spec.out_width = out_w;
  spec.crop = crop == "center" ? CropMode::kCenter : CropMode::kNone;
  check_output_spec(spec, "transform_image");
  const OutputFormat format = output_format(spec);
  Rng unused(0);  // "center" and "none" draw nothing; the flip is asked for
  ImagePlacement placement = place_image(spec, h, w, unused);
  const int oh = spec.resizes() ? out_h : h;
  const int ow = spec.resizes() ? out_w : w;
  std::vector<py::ssize_t> shape;
  if (hwc.ndim() == 2) {
    shape = {oh, ow};
  } else if (chw) {
    shape = {channels, oh, ow};
  } else {
    shape = {oh, ow, channels};
  }
  py::array out = to_float ? py::array(py::dtype::of<float>(), shape)
                           : py::array(py::dtype::of<uint8_t>(), shape);
  ResampleOutput target;
  target.height = oh;
  target.width = ow;
  target.flip = flip;
  target.format = &format;
  target.data = out.mutable_data();
  const uint8_t* src = hwc.data();
  {
    py::gil_scoped_release release;
    resample_area_into(src, h, w, channels, placement.area, target);
  }
  return out;
}

}  // namespace

void register_decode(py::module_& m) {
  m.def("decode_image", &decode_image_py, py::arg("data"), py::arg("mode") = "rgb",
        py::arg("where") = "<bytes>",
        "Decode a JPEG, PNG or WebP (chosen by magic bytes) to uint8 HxWx3 ('rgb') or HxW ('l'), "
        "pixel-identical to PIL's Image.open(...).convert('RGB' / 'L').");
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
  m.def("transform_image", &transform_image_py, py::arg("hwc"), py::arg("out_h"),
        py::arg("out_w"), py::arg("crop") = "center", py::arg("flip") = false,
        py::arg("chw") = false, py::arg("to_float") = false,
        "Resize/crop/flip/layout one uint8 image as the engine does.");
}

}  // namespace chute::bindings

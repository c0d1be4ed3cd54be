// chute_testing's entry points to the image decoders and kernels (whole
// and region decode, resampler, crop parameters): what the tests, the fuzzer
// and the benchmarks drive one image at a time. The engine calls the kernels natively. Every call releases the GIL
// around the native work.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/image_arguments.h"
#include "bindings/registry.h"
#include "core/error.h"
#include "core/random.h"
#include "decode/image_decoder.h"
#include "decode/image_field.h"
#include "image/crop_params.h"
#include "image/output_spec.h"
#include "image/pixel_format.h"
#include "image/resample.h"
#include "sources/field_decoder.h"

namespace py = pybind11;

namespace chute::bindings {
namespace {

using WindowTuple = std::tuple<int, int, int, int>;              // y, x, height, width
using BoxTuple = std::tuple<double, double, double, double>;     // y0, x0, y1, x1
using U8Array = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

Window to_window(const WindowTuple& t) {
  return Window{std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t)};
}

WindowTuple from_window(const Window& w) { return {w.y, w.x, w.height, w.width}; }

Layout parse_layout(const std::string& s) {
  if (s == "HWC") return Layout::kHWC;
  if (s == "CHW") return Layout::kCHW;
  CHUTE_CHECK(false, kUsage, "layout must be 'HWC' or 'CHW', not '" << s << "'");
  return Layout::kHWC;
}

PixelType parse_dtype(const std::string& s) {
  if (s == "uint8") return PixelType::kUint8;
  if (s == "float32") return PixelType::kFloat32;
  if (s == "float16") return PixelType::kFloat16;
  if (s == "bfloat16") return PixelType::kBFloat16;
  CHUTE_CHECK(false, kUsage,
              "dtype must be 'uint8', 'float32', 'float16' or 'bfloat16', not '" << s << "'");
  return PixelType::kUint8;
}

SimdLevel parse_simd(const std::string& s) {
  if (s == "auto") return SimdLevel::kAuto;
  if (s == "scalar") return SimdLevel::kScalar;
  if (s == "sse4.1") return SimdLevel::kSse41;
  if (s == "avx2") return SimdLevel::kAvx2;
  CHUTE_CHECK(false, kUsage, "simd must be 'auto', 'scalar', 'sse4.1' or 'avx2', not '" << s << "'");
  return SimdLevel::kAuto;
}

PassOrder parse_order(const std::string& s) {
  if (s == "auto") return PassOrder::kAuto;
  if (s == "horizontal") return PassOrder::kHorizontalFirst;
  if (s == "vertical") return PassOrder::kVerticalFirst;
  CHUTE_CHECK(false, kUsage, "order must be 'auto', 'horizontal' or 'vertical', not '" << s << "'");
  return PassOrder::kAuto;
}

OutputFormat make_format(int channels, const std::string& layout, const std::string& dtype,
                         const std::optional<std::vector<float>>& mean,
                         const std::optional<std::vector<float>>& std) {
  const Layout l = parse_layout(layout);
  const PixelType t = parse_dtype(dtype);
  CHUTE_CHECK(mean.has_value() == std.has_value(), kUsage, "mean and std go together");
  if (!mean) return OutputFormat(l, t);
  CHUTE_CHECK(static_cast<int>(mean->size()) == channels &&
                  static_cast<int>(std->size()) == channels,
              kUsage, "mean and std need one value per channel (" << channels << ")");
  std::array<float, 3> m{}, s{};
  for (int c = 0; c < 3; ++c) {
    m[c] = (*mean)[c < channels ? c : 0];
    s[c] = (*std)[c < channels ? c : 0];
  }
  return OutputFormat(l, t, m, s);
}

// An array for an out_h x out_w image in `format`; HW for one channel.
py::array make_output(const OutputFormat& format, int channels, int out_h, int out_w) {
  std::vector<py::ssize_t> shape;
  if (channels == 1) {
    shape = {out_h, out_w};
  } else if (format.layout() == Layout::kCHW) {
    shape = {channels, out_h, out_w};
  } else {
    shape = {out_h, out_w, channels};
  }
  switch (format.type()) {
    case PixelType::kUint8:
      return py::array(py::dtype::of<uint8_t>(), shape);
    case PixelType::kFloat32:
      return py::array(py::dtype::of<float>(), shape);
    case PixelType::kFloat16:
      return py::array(py::dtype("float16"), shape);
    case PixelType::kBFloat16:
      return py::array(py::dtype::of<uint16_t>(), shape);  // the bits; numpy has no bfloat16
  }
  return py::array();
}

// Where the resampler writes an out_h x out_w image: into `out`, in `format`.
ResampleOutput output_into(py::array& out, int out_h, int out_w, bool flip,
                           const OutputFormat& format) {
  ResampleOutput target;
  target.height = out_h;
  target.width = out_w;
  target.flip = flip;
  target.format = &format;
  target.data = out.mutable_data();
  return target;
}

// The area from the optional crop window and box: a crop alone is
// crop-then-resize; a box reads the region (the crop, else the whole image).
SourceArea make_area(int h, int w, const std::optional<WindowTuple>& crop,
                     const std::optional<BoxTuple>& box) {
  SourceArea area = crop_area(crop ? to_window(*crop) : Window{0, 0, h, w});
  if (box) {
    area.box = Box{std::get<0>(*box), std::get<1>(*box), std::get<2>(*box), std::get<3>(*box)};
  }
  return area;
}

py::array resize_py(const U8Array& image, int out_h, int out_w,
                    const std::optional<WindowTuple>& crop, const std::optional<BoxTuple>& box,
                    bool flip, const std::string& layout, const std::string& dtype,
                    const std::optional<std::vector<float>>& mean,
                    const std::optional<std::vector<float>>& std, const std::string& simd,
                    const std::string& order) {
  CHUTE_CHECK(image.ndim() == 2 ||
                  (image.ndim() == 3 && (image.shape(2) == 1 || image.shape(2) == 3)),
              kUsage, "resize expects an HW or HWC (C = 1 or 3) uint8 array");
  const int h = static_cast<int>(image.shape(0));
  const int w = static_cast<int>(image.shape(1));
  const int c = image.ndim() == 3 ? static_cast<int>(image.shape(2)) : 1;
  CHUTE_CHECK(h > 0 && w > 0, kUsage, "resize of an empty image");
  const OutputFormat format = make_format(c, layout, dtype, mean, std);
  const SourceArea area = make_area(h, w, crop, box);
  py::array out = make_output(format, c, out_h, out_w);
  ResampleOutput target = output_into(out, out_h, out_w, flip, format);
  target.simd = parse_simd(simd);
  target.order = parse_order(order);
  const uint8_t* src = image.data();
  {
    py::gil_scoped_release release;
    const Window& r = area.region;
    CHUTE_CHECK(r.y >= 0 && r.x >= 0 && r.y + r.height <= h && r.x + r.width <= w, kUsage,
                "crop " << r.height << "x" << r.width << " at (" << r.y << ", " << r.x
                        << ") does not fit a " << h << "x" << w << " image");
    resample_area_into(src, h, w, c, area, target);
  }
  return out;
}

RegionDecode parse_region(const std::string& s) {
  if (s == "full") return RegionDecode::kFull;
  if (s == "crop") return RegionDecode::kCrop;
  if (s == "scaled") return RegionDecode::kCropScaled;
  CHUTE_CHECK(false, kUsage, "region must be 'full', 'crop' or 'scaled', not '" << s << "'");
  return RegionDecode::kFull;
}

py::tuple decode_resampled_py(const py::bytes& data, int out_h, int out_w,
                              const std::optional<WindowTuple>& crop,
                              const std::optional<BoxTuple>& box, const std::string& region,
                              const std::string& mode_name, bool flip, const std::string& layout,
                              const std::string& dtype,
                              const std::optional<std::vector<float>>& mean,
                              const std::optional<std::vector<float>>& std,
                              const std::string& simd, const std::string& order) {
  const ColorMode mode = parse_mode(mode_name);
  const RegionDecode how = parse_region(region);
  const int c = mode == ColorMode::kRgb ? 3 : 1;
  const OutputFormat format = make_format(c, layout, dtype, mean, std);
  const Bytes in = view(data);
  ImageInfo info;
  {
    py::gil_scoped_release release;
    info = probe_image(in.data, in.size, "<bytes>");
  }
  const SourceArea area = make_area(info.height, info.width, crop, box);
  py::array out = make_output(format, c, out_h, out_w);
  ResampleOutput target = output_into(out, out_h, out_w, flip, format);
  target.simd = parse_simd(simd);
  target.order = parse_order(order);
  RegionDecodeInfo result;
  {
    py::gil_scoped_release release;
    result = decode_image_resampled(in.data, in.size, mode, area, target, how, "<bytes>");
  }
  return py::make_tuple(out, result.scale_num, from_window(result.decoded));
}

py::array rrc_params_py(int height, int width, const std::tuple<double, double>& scale,
                        const std::tuple<double, double>& ratio, uint64_t seed, int64_t count) {
  CHUTE_CHECK(count >= 0, kUsage, "count must be >= 0");
  py::array_t<int64_t> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(count), 4});
  int64_t* dst = out.mutable_data();
  {
    py::gil_scoped_release release;
    Rng rng(seed);
    for (int64_t i = 0; i < count; ++i) {
      const Window w = random_resized_crop(height, width, std::get<0>(scale), std::get<1>(scale),
                                           std::get<0>(ratio), std::get<1>(ratio), rng);
      dst[4 * i + 0] = w.y;
      dst[4 * i + 1] = w.x;
      dst[4 * i + 2] = w.height;
      dst[4 * i + 3] = w.width;
    }
  }
  return std::move(out);
}

std::tuple<WindowTuple, BoxTuple> center_crop_area_py(int height, int width, int resize,
                                                      int crop_h, int crop_w) {
  const SourceArea a = resize_center_crop(height, width, resize, crop_h, crop_w);
  return {from_window(a.region), BoxTuple{a.box.y0, a.box.x0, a.box.y1, a.box.x1}};
}

// The placement the engine's image field decoder draws for one row: the
// source area it resamples and whether it mirrors, so that a test can
// rebuild a sample's expected pixels with Pillow.
std::tuple<WindowTuple, BoxTuple, bool> image_placement_py(const ImageOutputSpec& spec,
                                                           ColorMode color, int height, int width,
                                                           uint64_t seed, int64_t epoch,
                                                           int64_t batch, size_t row,
                                                           size_t field) {
  const ImageFieldDecoder decoder(color, spec, "<diagnostic>");
  const ImagePlacement p =
      decoder.placement(height, width, RowPosition{seed, epoch, batch, row, field});
  const Box& b = p.area.box;
  return {from_window(p.area.region), BoxTuple{b.y0, b.x0, b.y1, b.x1}, p.flip};
}

std::string simd_level_py() {
  switch (best_simd_level()) {
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kSse41:
      return "sse4.1";
    default:
      return "scalar";
  }
}

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
  const ResampleOutput target = output_into(out, oh, ow, flip, format);
  const uint8_t* src = hwc.data();
  {
    py::gil_scoped_release release;
    resample_area_into(src, h, w, channels, placement.area, target);
  }
  return out;
}

}  // namespace

void register_testing_image(py::module_& m) {
  m.def("resize", &resize_py, py::arg("image"), py::arg("out_h"), py::arg("out_w"),
        py::arg("crop") = py::none(), py::arg("box") = py::none(), py::arg("flip") = false,
        py::arg("layout") = "HWC", py::arg("dtype") = "uint8", py::arg("mean") = py::none(),
        py::arg("std") = py::none(), py::arg("simd") = "auto", py::arg("order") = "auto",
        "Resample a uint8 HW/HWC image to out_h x out_w. crop=(y, x, h, w) crops "
        "then resizes (torchvision's resized_crop); box=(y0, x0, y1, x1) maps that fractional "
        "area, reading across its edges, from the crop or the whole image. dtype 'bfloat16' "
        "comes back as its uint16 bits. order: which pass runs first ('auto': the cheaper).");
  m.def("decode_resampled", &decode_resampled_py, py::arg("data"), py::arg("out_h"),
        py::arg("out_w"), py::arg("crop") = py::none(), py::arg("box") = py::none(),
        py::arg("region") = "scaled", py::arg("mode") = "rgb", py::arg("flip") = false,
        py::arg("layout") = "HWC", py::arg("dtype") = "uint8", py::arg("mean") = py::none(),
        py::arg("std") = py::none(), py::arg("simd") = "auto", py::arg("order") = "auto",
        "Decode an image and resample crop/box (full-image pixels) as resize "
        "does. region: 'full' (decode all), 'crop' (JPEG: only the rows and iMCU columns "
        "read), 'scaled' ('crop' at the smallest DCT scale M/8, M in 1, 2, 4, 8, that still "
        "covers the output). Returns (image, M, (y, x, h, w) decoded in the scaled image).");
  m.def("rrc_params", &rrc_params_py, py::arg("height"), py::arg("width"),
        py::arg("scale") = std::make_tuple(0.08, 1.0),
        py::arg("ratio") = std::make_tuple(3.0 / 4.0, 4.0 / 3.0), py::arg("seed") = 0,
        py::arg("count") = 1,
        "`count` RandomResizedCrop windows drawn in turn from one generator "
        "seeded with `seed`, as an int64 array of rows (y, x, h, w).");
  m.def("center_crop_area", &center_crop_area_py, py::arg("height"), py::arg("width"),
        py::arg("resize"), py::arg("crop_h"), py::arg("crop_w"),
        "Resize(resize) + CenterCrop((crop_h, crop_w)) as a resample area: "
        "((y, x, h, w) region, (y0, x0, y1, x1) box) in source pixels.");
  m.def("image_placement", &image_placement_py, py::arg("spec"), py::arg("color"),
        py::arg("height"), py::arg("width"), py::arg("seed"), py::arg("epoch"), py::arg("batch"),
        py::arg("row"), py::arg("field"),
        "The ((y, x, h, w) region, (y0, x0, y1, x1) box, flip) that an image field "
        "decoded by `spec` resamples for the row at (seed, epoch, batch, row, field) of a "
        "height x width image (source pixels).");
  m.def("simd_level", &simd_level_py, "The resampler's SIMD level on this CPU.");
  m.def("decode_image", &decode_image_py, py::arg("data"), py::arg("mode") = "rgb",
        py::arg("where") = "<bytes>",
        "Decode a JPEG, PNG or WebP (chosen by magic bytes) to uint8 HxWx3 ('rgb') or HxW ('l'), "
        "pixel-identical to PIL's Image.open(...).convert('RGB' / 'L').");
  m.def("transform_image", &transform_image_py, py::arg("hwc"), py::arg("out_h"),
        py::arg("out_w"), py::arg("crop") = "center", py::arg("flip") = false,
        py::arg("chw") = false, py::arg("to_float") = false,
        "Resize/crop/flip/layout one uint8 image as the engine does.");
}

const BindingsFile kTestingImageBindings{"chute_testing", "testing_image", {}, register_testing_image};

}  // namespace chute::bindings

#include "image/transform.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace chute {
namespace {

// For each output pixel along one axis: the first input pixel it reads and
// its normalized weights. A triangle (bilinear) filter whose support grows
// with the shrink factor, so that shrinking averages every input pixel
// instead of sampling a few (aliasing). The same scheme as Pillow's
// reducing resample; the arithmetic differs, so results may differ by 1.
struct Taps {
  int max_taps = 0;
  std::vector<int> start;
  std::vector<int> count;
  std::vector<float> weights;  // max_taps per output pixel
};

Taps make_taps(int in_size, int out_size) {
  Taps taps;
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle's radius is 1 input pixel, scaled
  taps.max_taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  taps.start.resize(out_size);
  taps.count.resize(out_size);
  taps.weights.assign(static_cast<size_t>(out_size) * taps.max_taps, 0.0f);
  for (int o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    int lo = static_cast<int>(std::floor(center - support + 0.5));
    int hi = static_cast<int>(std::floor(center + support + 0.5));
    lo = std::max(lo, 0);
    hi = std::min(hi, in_size);
    hi = std::min(hi, lo + taps.max_taps);
    float* w = &taps.weights[static_cast<size_t>(o) * taps.max_taps];
    double total = 0.0;
    for (int i = lo; i < hi; ++i) {
      const double d = std::abs((i + 0.5 - center) / filter_scale);
      const double v = d < 1.0 ? 1.0 - d : 0.0;
      w[i - lo] = static_cast<float>(v);
      total += v;
    }
    if (total <= 0.0) {
      // Cannot happen for in_size >= 1 (the nearest pixel has d < 1), but a
      // zero division would write NaN-derived garbage; fall back to it.
      lo = std::min(static_cast<int>(center), in_size - 1);
      hi = lo + 1;
      w[0] = 1.0f;
      total = 1.0;
    }
    for (int i = 0; i < hi - lo; ++i) w[i] = static_cast<float>(w[i] / total);
    taps.start[o] = lo;
    taps.count[o] = hi - lo;
  }
  return taps;
}

uint8_t to_u8(float v) {
  // Weights sum to 1, so v is in [0, 255] up to rounding error; +0.5 rounds.
  const int r = static_cast<int>(v + 0.5f);
  return static_cast<uint8_t>(std::clamp(r, 0, 255));
}

int output_extent(int spec_size, int image_size) { return spec_size > 0 ? spec_size : image_size; }

}  // namespace

void resize_bilinear(const uint8_t* src, int src_h, int src_w, int channels, uint8_t* dst,
                     int dst_h, int dst_w) {
  CHUTE_CHECK(src_h > 0 && src_w > 0 && dst_h > 0 && dst_w > 0 && channels > 0, kUsage,
              "resize from " << src_h << "x" << src_w << " to " << dst_h << "x" << dst_w
                             << " with " << channels << " channels");
  if (src_h == dst_h && src_w == dst_w) {
    std::memcpy(dst, src, static_cast<size_t>(src_h) * src_w * channels);
    return;
  }
  const Taps tx = make_taps(src_w, dst_w);
  const Taps ty = make_taps(src_h, dst_h);
  // Horizontal pass into floats (no rounding between the passes), then
  // vertical. A row of the intermediate is dst_w * channels floats.
  const size_t mid_row = static_cast<size_t>(dst_w) * channels;
  std::vector<float> mid(static_cast<size_t>(src_h) * mid_row);
  for (int y = 0; y < src_h; ++y) {
    const uint8_t* in = src + static_cast<size_t>(y) * src_w * channels;
    float* m = &mid[y * mid_row];
    for (int x = 0; x < dst_w; ++x) {
      const float* w = &tx.weights[static_cast<size_t>(x) * tx.max_taps];
      const uint8_t* p = in + static_cast<size_t>(tx.start[x]) * channels;
      for (int c = 0; c < channels; ++c) {
        float acc = 0.0f;
        for (int k = 0; k < tx.count[x]; ++k) acc += w[k] * p[k * channels + c];
        m[x * channels + c] = acc;
      }
    }
  }
  std::vector<float> acc(mid_row);
  for (int y = 0; y < dst_h; ++y) {
    const float* w = &ty.weights[static_cast<size_t>(y) * ty.max_taps];
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int k = 0; k < ty.count[y]; ++k) {
      const float* m = &mid[(ty.start[y] + k) * mid_row];
      const float wk = w[k];
      for (size_t i = 0; i < mid_row; ++i) acc[i] += wk * m[i];
    }
    uint8_t* out = dst + y * mid_row;
    for (size_t i = 0; i < mid_row; ++i) out[i] = to_u8(acc[i]);
  }
}

ImageSize resize_target(int h, int w, const ImageOutputSpec& spec) {
  const int oh = output_extent(spec.out_height, h);
  const int ow = output_extent(spec.out_width, w);
  if (spec.crop == CropMode::kNone) return {oh, ow};
  // Cover the output: the side with the larger ratio out/in matches exactly,
  // the other is scaled by the same ratio (rounded) and is at least as big.
  const int64_t H = h, W = w;
  if (int64_t{oh} * W >= int64_t{ow} * H) {
    const int64_t nw = (W * oh + H / 2) / H;
    return {oh, static_cast<int>(std::max<int64_t>(nw, ow))};
  }
  const int64_t nh = (H * ow + W / 2) / W;
  return {static_cast<int>(std::max<int64_t>(nh, oh)), ow};
}

void center_crop_origin(int h, int w, const ImageOutputSpec& spec, int* crop_y, int* crop_x) {
  const int oh = output_extent(spec.out_height, h);
  const int ow = output_extent(spec.out_width, w);
  CHUTE_CHECK(oh <= h && ow <= w, kUsage,
              "crop of " << oh << "x" << ow << " from a " << h << "x" << w << " image");
  *crop_y = (h - oh) / 2;
  *crop_x = (w - ow) / 2;
}

namespace {

// The part of a decoded HWC image that goes to the output.
struct Window {
  const uint8_t* hwc;
  int width;  // of the decoded image
  int crop_y;
  int crop_x;
  int out_height;
  int out_width;
  bool flip;
};

template <int C, bool CHW, typename T, typename Convert>
void emit_window(const Window& win, T* dst, Convert convert) {
  const size_t plane = static_cast<size_t>(win.out_height) * win.out_width;
  const std::ptrdiff_t step = win.flip ? -C : C;
  for (int y = 0; y < win.out_height; ++y) {
    const uint8_t* row =
        win.hwc + (static_cast<size_t>(win.crop_y + y) * win.width + win.crop_x) * C;
    const uint8_t* px = win.flip ? row + static_cast<size_t>(win.out_width - 1) * C : row;
    const size_t row_start = static_cast<size_t>(y) * win.out_width;
    if constexpr (CHW) {
      T* planes[C];
      for (int c = 0; c < C; ++c) planes[c] = dst + c * plane + row_start;
      for (int x = 0; x < win.out_width; ++x, px += step) {
        for (int c = 0; c < C; ++c) planes[c][x] = convert(px[c]);
      }
    } else {
      T* out = dst + row_start * C;
      for (int x = 0; x < win.out_width; ++x, px += step) {
        for (int c = 0; c < C; ++c) out[static_cast<size_t>(x) * C + c] = convert(px[c]);
      }
    }
  }
}

}  // namespace

void write_image_output(const uint8_t* hwc, int h, int w, const ImageOutputSpec& spec, int crop_y,
                        int crop_x, bool flip, void* out) {
  const int oh = output_extent(spec.out_height, h);
  const int ow = output_extent(spec.out_width, w);
  const int channels = spec.channels;
  CHUTE_CHECK(channels == 1 || channels == 3, kUsage,
              "image output with " << channels << " channels (1 or 3 expected)");
  CHUTE_CHECK(crop_y >= 0 && crop_x >= 0 && crop_y + oh <= h && crop_x + ow <= w, kUsage,
              "crop window " << oh << "x" << ow << " at (" << crop_y << ", " << crop_x
                             << ") does not fit a " << h << "x" << w << " image");

  // webdataset computes astype("f") / 255.0: a float32 divided by 255 in
  // float32 (NEP 50 keeps the Python float weak). One IEEE division per
  // value, tabulated; no reciprocal multiply, which would differ in the last bit.
  static const auto kToFloat = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = static_cast<float>(i) / 255.0f;
    return t;
  }();

  if (!spec.to_float && !spec.chw && !flip) {
    // The common uint8 HWC case is a row-by-row copy.
    auto* dst = static_cast<uint8_t*>(out);
    const size_t row_bytes = static_cast<size_t>(ow) * channels;
    for (int y = 0; y < oh; ++y) {
      std::memcpy(dst + y * row_bytes,
                  hwc + (static_cast<size_t>(crop_y + y) * w + crop_x) * channels, row_bytes);
    }
    return;
  }
  const Window window{hwc, w, crop_y, crop_x, oh, ow, flip};
  auto identity = [](uint8_t v) { return v; };
  auto to_float = [](uint8_t v) { return kToFloat[v]; };
  // Channel count and layout as template arguments: the per-pixel loop then
  // has no branches and unrolls (a generic loop cost ~2 ns per value, as much
  // as decoding a small JPEG).
  if (spec.to_float) {
    auto* dst = static_cast<float*>(out);
    if (channels == 3) {
      if (spec.chw) {
        emit_window<3, true>(window, dst, to_float);
      } else {
        emit_window<3, false>(window, dst, to_float);
      }
    } else {
      emit_window<1, false>(window, dst, to_float);
    }
  } else {
    auto* dst = static_cast<uint8_t*>(out);
    if (channels == 3) {
      if (spec.chw) {
        emit_window<3, true>(window, dst, identity);
      } else {
        emit_window<3, false>(window, dst, identity);
      }
    } else {
      emit_window<1, false>(window, dst, identity);
    }
  }
}

}  // namespace chute

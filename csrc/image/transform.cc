#include "image/transform.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>

#include "core/error.h"
#include "image/resample.h"
#include "image/split_rgb.h"

namespace chute {
namespace {

int output_extent(int spec_size, int image_size) { return spec_size > 0 ? spec_size : image_size; }

}  // namespace

void resize_bilinear(const uint8_t* src, int src_h, int src_w, int channels, uint8_t* dst,
                     int dst_h, int dst_w) {
  CHUTE_CHECK(src_h > 0 && src_w > 0 && dst_h > 0 && dst_w > 0, kUsage,
              "resize from " << src_h << "x" << src_w << " to " << dst_h << "x" << dst_w);
  static const OutputFormat hwc_bytes;
  resample_into(src, src_h, src_w, channels, Window{0, 0, src_h, src_w}, dst_h, dst_w, false,
                hwc_bytes, dst);
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

// webdataset computes astype("f") / 255.0: a float32 divided by 255 in
// float32 (NEP 50 keeps the Python float weak). One IEEE division per value,
// tabulated; no reciprocal multiply, which would differ in the last bit.
const std::array<float, 256>& float_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = static_cast<float>(i) / 255.0f;
    return t;
  }();
  return table;
}

}  // namespace

ImageWriter::ImageWriter(int h, int w, const ImageOutputSpec& spec, int crop_y, int crop_x,
                         bool flip, void* out)
    : h_(h),
      w_(w),
      channels_(spec.channels),
      crop_y_(crop_y),
      crop_x_(crop_x),
      out_h_(output_extent(spec.out_height, h)),
      out_w_(output_extent(spec.out_width, w)),
      flip_(flip),
      out_(out) {
  CHUTE_CHECK(channels_ == 1 || channels_ == 3, kUsage,
              "image output with " << channels_ << " channels (1 or 3 expected)");
  CHUTE_CHECK(crop_y >= 0 && crop_x >= 0 && crop_y + out_h_ <= h && crop_x + out_w_ <= w, kUsage,
              "crop window " << out_h_ << "x" << out_w_ << " at (" << crop_y << ", " << crop_x
                             << ") does not fit a " << h << "x" << w << " image");
  // Channel count, layout and dtype as template arguments: the per-pixel loop
  // then has no branches and unrolls (a generic loop cost ~2 ns per value, as
  // much as decoding a small JPEG).
  if (spec.to_float) {
    if (channels_ == 1) {
      emit_ = emit_rows<1, false, float, true>;
    } else {
      emit_ = spec.chw ? emit_rows<3, true, float, true> : emit_rows<3, false, float, true>;
    }
  } else {
    if (channels_ == 1) {
      emit_ = emit_rows<1, false, uint8_t, false>;
    } else {
      emit_ = spec.chw ? emit_rows<3, true, uint8_t, false> : emit_rows<3, false, uint8_t, false>;
    }
  }
}

void ImageWriter::begin(int height, int width, int channels) {
  // The batch slot was sized from the probed header; a decoder that disagrees
  // (it read the same bytes) must not write past it.
  CHUTE_CHECK(height == h_ && width == w_ && channels == channels_, kData,
              "decoded image is " << height << "x" << width << "x" << channels << ", expected "
                                  << h_ << "x" << w_ << "x" << channels_);
}

void ImageWriter::rows(const uint8_t* hwc, size_t stride, int first_row, int count) {
  // The output rows whose source row lies in this band.
  const int y_begin = std::max(first_row, crop_y_) - crop_y_;
  const int y_end = std::min(first_row + count, crop_y_ + out_h_) - crop_y_;
  if (y_begin < y_end) emit_(*this, hwc, stride, first_row, y_begin, y_end);
}

template <int C, bool CHW, typename T, bool Float>
void ImageWriter::emit_rows(const ImageWriter& w, const uint8_t* band, size_t stride,
                            int first_row, int y_begin, int y_end) {
  const size_t plane = static_cast<size_t>(w.out_h_) * w.out_w_;
  const std::ptrdiff_t step = w.flip_ ? -C : C;
  const float* to_float = float_table().data();
  auto convert = [to_float](uint8_t v) {
    if constexpr (Float) {
      return to_float[v];
    } else {
      return v;
    }
  };
  T* dst = static_cast<T*>(w.out_);
  for (int y = y_begin; y < y_end; ++y) {
    const uint8_t* row = band + static_cast<size_t>(w.crop_y_ + y - first_row) * stride +
                         static_cast<size_t>(w.crop_x_) * C;
    const size_t row_start = static_cast<size_t>(y) * w.out_w_;
    if constexpr (!Float) {
      if (!w.flip_) {
        if constexpr (CHW) {
          split_rgb(row, w.out_w_, dst + row_start, dst + plane + row_start,
                    dst + 2 * plane + row_start);
        } else {
          std::memcpy(dst + row_start * C, row, static_cast<size_t>(w.out_w_) * C);
        }
        continue;
      }
    }
    const uint8_t* px = w.flip_ ? row + static_cast<size_t>(w.out_w_ - 1) * C : row;
    if constexpr (CHW) {
      T* planes[C];
      for (int c = 0; c < C; ++c) planes[c] = dst + c * plane + row_start;
      for (int x = 0; x < w.out_w_; ++x, px += step) {
        for (int c = 0; c < C; ++c) planes[c][x] = convert(px[c]);
      }
    } else {
      T* out = dst + row_start * C;
      for (int x = 0; x < w.out_w_; ++x, px += step) {
        for (int c = 0; c < C; ++c) out[static_cast<size_t>(x) * C + c] = convert(px[c]);
      }
    }
  }
}

void write_image_output(const uint8_t* hwc, int h, int w, const ImageOutputSpec& spec, int crop_y,
                        int crop_x, bool flip, void* out) {
  ImageWriter writer(h, w, spec, crop_y, crop_x, flip, out);
  writer.rows(hwc, static_cast<size_t>(w) * spec.channels, 0, h);
}

}  // namespace chute

// The fixed-size image operations a batch needs so that differently sized
// images collate into one [B, ...] tensor: resize the shorter side, crop
// (center or random), horizontal flip, layout (HWC/CHW) and dtype (uint8 or
// float32 in [0, 1], computed as x / 255.0f like webdataset).
#pragma once

#include <cstddef>
#include <cstdint>

#include "image/row_sink.h"

namespace chute {

enum class CropMode : uint8_t { kNone, kCenter, kRandom };

struct ImageOutputSpec {
  int channels = 3;         // 3 (RGB) or 1 (gray)
  bool chw = false;         // torch layout
  bool to_float = false;    // float32 / 255
  bool squeeze_gray = true; // gray images as HW (webdataset's l8), not HW1
  int out_height = 0;       // 0: keep the decoded size
  int out_width = 0;
  CropMode crop = CropMode::kCenter;
  bool random_flip = false;
};

// Bilinear resize of an 8-bit HWC image (1 or 3 channels), antialiased when
// shrinking: the resampler of image/resample.h over the whole image.
void resize_bilinear(const uint8_t* src, int src_h, int src_w, int channels, uint8_t* dst,
                     int dst_h, int dst_w);

// The size to resize an h x w image to before write_image_output: the spec's
// output size itself for CropMode::kNone (aspect ratio not kept), else the
// smallest size with the image's aspect ratio that covers the output (the
// shorter side matches; the crop then removes the excess). A 0 output size
// keeps the image's size.
struct ImageSize {
  int height;
  int width;
};
ImageSize resize_target(int h, int w, const ImageOutputSpec& spec);

// The crop window's top-left corner for CropMode::kCenter (and for kNone, where
// the window is the whole image). Throws kUsage when the output is larger.
void center_crop_origin(int h, int w, const ImageOutputSpec& spec, int* crop_y, int* crop_x);

// Writes a decoded HWC uint8 image into `out` (uint8 or float32 per spec) in
// the spec's layout. crop_y/crop_x select the window when the spec asks for an
// output size smaller than the image; flip mirrors horizontally.
void write_image_output(const uint8_t* hwc, int h, int w, const ImageOutputSpec& spec, int crop_y,
                        int crop_x, bool flip, void* out);

// write_image_output fed band by band: pass it to decode_image_rows and each
// group of decoded rows goes to `out` while still in L1. For images that need
// no resize (the crop window and flip are as for write_image_output). begin()
// throws kData unless the decoded image is h x w with spec.channels channels.
class ImageWriter final : public RowSink {
 public:
  ImageWriter(int h, int w, const ImageOutputSpec& spec, int crop_y, int crop_x, bool flip,
              void* out);
  void begin(int height, int width, int channels) override;
  void rows(const uint8_t* hwc, size_t stride, int first_row, int count) override;

 private:
  // One instantiation of the per-layout/dtype row loop, picked once.
  using EmitRows = void (*)(const ImageWriter& w, const uint8_t* band, size_t stride,
                            int first_row, int y_begin, int y_end);
  template <int C, bool CHW, typename T, bool Float>
  static void emit_rows(const ImageWriter& w, const uint8_t* band, size_t stride, int first_row,
                        int y_begin, int y_end);

  int h_;
  int w_;
  int channels_;
  int crop_y_;
  int crop_x_;
  int out_h_;
  int out_w_;
  bool flip_;
  void* out_;
  EmitRows emit_ = nullptr;
};

}  // namespace chute

// JPEG (libjpeg-turbo, JDCT_ISLOW + fancy upsampling: Pillow's settings, so
// output is pixel-identical) and PNG (libpng) decoding into caller memory.
// Decoder state is kept per thread. Errors are kData naming `where`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "image/resample.h"
#include "image/row_sink.h"

namespace chute {

enum class ImageFormat : uint8_t { kJpeg, kPng };
enum class ColorMode : uint8_t { kRgb, kGray };  // Pillow's convert("RGB") / convert("L")

struct ImageInfo {
  ImageFormat format;
  int width;
  int height;
};

// The decompression bomb guard: images of more pixels than this are refused
// from their header, before any pixel memory exists. The default is where
// Pillow raises DecompressionBombError (2 * Image.MAX_IMAGE_PIXELS, 2 *
// 89478485); chute has no warning band below it. Process-wide, read by every
// decode thread; 0 turns the guard off.
constexpr int64_t kDefaultMaxImagePixels = 2 * int64_t{89478485};
void set_max_image_pixels(int64_t pixels);
int64_t max_image_pixels();

// Reads only the header. Rejects 0-sized images and images above
// max_image_pixels().
ImageInfo probe_image(const uint8_t* data, size_t size, const std::string& where);

// Decodes the whole image as 8-bit HWC (C = 3 for kRgb, 1 for kGray) into
// `out`, which holds info.height * info.width * C bytes.
void decode_image(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                  const std::string& where);

// The same pixels as decode_image, handed to `sink` a few rows at a time
// (JPEG: each group libjpeg produces, from a buffer that stays in L1), so that
// a layout change such as HWC -> CHW happens while the rows are hot.
void decode_image_rows(const uint8_t* data, size_t size, ColorMode mode, RowSink& sink,
                       const std::string& where);

// How much of a JPEG decode_image_resampled decodes. PNG always decodes whole.
enum class RegionDecode : uint8_t {
  // Every pixel, as decode_image (Pillow-identical), then resampled.
  kFull,
  // Only the rows the resample reads and the columns from the iMCU boundary
  // at or left of its first column to its last; rows below are not decoded.
  kCrop,
  // kCrop in the DCT domain at the smallest scale M/8 (M = 1, 2, 4 or 8) at
  // which the box is still at least the output size on both axes; the
  // resample then starts from the scaled pixels. Close to kFull, not equal.
  kCropScaled,
};

// What decode_image_resampled decoded: the scale M (of M/8) and the pixels
// in the scaled image's coordinates (all of it for kFull and PNG).
struct RegionDecodeInfo {
  int scale_num = 8;
  Window decoded;
};

// Decodes the image and resamples `area` (full-image pixels, inside the
// image) into out: crop, resize, flip, layout and dtype in one pass over the
// decoded rows, which are never stored whole.
RegionDecodeInfo decode_image_resampled(const uint8_t* data, size_t size, ColorMode mode,
                                        const SourceArea& area, const ResampleOutput& out,
                                        RegionDecode how, const std::string& where);

// "jpeg" / "png".
const char* image_format_name(ImageFormat format);

// The per-format halves of the two calls above; decode_image and probe_image
// pick one by magic bytes (file extensions lie in real webdataset shards).
namespace detail {

ImageInfo probe_jpeg(const uint8_t* data, size_t size, const std::string& where);
void decode_jpeg(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                 const std::string& where);
void decode_jpeg_rows(const uint8_t* data, size_t size, ColorMode mode, RowSink& sink,
                      const std::string& where);
// The JPEG half of decode_image_resampled for kCrop / kCropScaled.
RegionDecodeInfo decode_jpeg_resampled(const uint8_t* data, size_t size, ColorMode mode,
                                       const SourceArea& area, const ResampleOutput& out,
                                       bool dct_scaling, const std::string& where);
// The entropy-decoding part of decode_jpeg only (coefficients, no pixels):
// a benchmark's floor for region decoding.
void entropy_decode_jpeg(const uint8_t* data, size_t size, const std::string& where);
ImageInfo probe_png(const uint8_t* data, size_t size, const std::string& where);
void decode_png(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                const std::string& where);

// Throws kData naming `where` for 0-sized images and images above max_image_pixels().
void check_image_size(const char* format, int64_t width, int64_t height,
                      const std::string& where);

// Pillow's conversions, bit for bit (libImaging/Convert.c): convert("L") is
// ITU-R 601-2 luma in 16.16 fixed point with rounding; convert("RGB") of a
// CMYK image is nk - nk*C/255 per channel with nk = 255 - K.
void rgb_to_l(const uint8_t* rgb, uint8_t* l, size_t pixels);
void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, size_t pixels);
void cmyk_to_l(const uint8_t* cmyk, uint8_t* l, size_t pixels);
void gray_to_rgb(const uint8_t* gray, uint8_t* rgb, size_t pixels);

}  // namespace detail

}  // namespace chute

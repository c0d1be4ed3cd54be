// Image decoding into caller memory, for every format in one table
// (image_decoder.cc; each format's <format>_decoder.h says what it matches of
// Pillow's decode). The format is picked by magic bytes, never by file
// extension (extensions lie in real webdataset shards). Decoder state is kept
// per thread. Errors are kData naming `where`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "image/resample.h"
#include "image/row_sink.h"

namespace chute {

enum class ColorMode : uint8_t { kRgb, kGray };  // Pillow's convert("RGB") / convert("L")

struct ImageInfo {
  const char* format;  // the table row's name: "jpeg", "png", ...
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

// A format of the table, as chute._core.image_formats() shows it: the
// Python layer takes its native member extensions from here, and
// scripts/gen_docs_tables.py the docs' table of formats.
struct ImageFormat {
  std::string name;
  std::string title;
  std::vector<std::string> extensions;
  bool region_decode;  // a resize decodes only around its crop
};
std::vector<ImageFormat> image_formats();

// Reads only the header. Rejects 0-sized images and images above
// max_image_pixels().
ImageInfo probe_image(const uint8_t* data, size_t size, const std::string& where);

// Decodes the whole image as 8-bit HWC (C = 3 for kRgb, 1 for kGray) into
// `out`, which holds info.height * info.width * C bytes.
void decode_image(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                  const std::string& where);

// How much of an image decode_image_resampled decodes. A format without a
// region decode (PNG) always decodes whole.
enum class RegionDecode : uint8_t {
  // Every pixel, as decode_image (Pillow-identical), then resampled.
  kFull,
  // Only (about) the rows and columns the resample reads, as the format's
  // region decode says. JPEG: the columns from the iMCU boundary at or left
  // of its first to its last; rows below are not decoded.
  kCrop,
  // JPEG: kCrop in the DCT domain at the smallest scale M/8 (M = 1, 2, 4 or
  // 8) at which the box is still at least the output size on both axes; the
  // resample then starts from the scaled pixels. Close to kFull, not equal.
  // Formats without such a scale: kCrop.
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

// The per-format halves of the calls above, and what they share.
namespace detail {

// What a format's header probe reads.
struct ImageSize {
  int width;
  int height;
};

// One image format: a row of the table in image_decoder.cc. decode_rows and
// decode_region may be null: the format then decodes whole into a per-thread
// buffer, which is handed to the row sink as one band (and, for a resample,
// read only where the crop lies).
struct ImageCodec {
  const char* name;   // ImageInfo::format: "jpeg"
  const char* title;  // in messages: "JPEG"
  // The member extensions webdataset gives such images, space-separated
  // ("jpg jpeg"): chute decodes members of these natively.
  const char* extensions;
  // Whether the first bytes are this format's signature.
  bool (*sniff)(const uint8_t* data, size_t size);
  // The header alone; refuses what check_image_size refuses.
  ImageSize (*probe)(const uint8_t* data, size_t size, const std::string& where);
  // The whole image, 8-bit HWC (C = 3 for kRgb, 1 for kGray), into `out`.
  void (*decode)(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                 const std::string& where);
  // The same pixels, a few rows at a time, begin() first.
  void (*decode_rows)(const uint8_t* data, size_t size, ColorMode mode, RowSink& sink,
                      const std::string& where);
  // decode_image_resampled for kCrop (scaled false) and kCropScaled (true).
  RegionDecodeInfo (*decode_region)(const uint8_t* data, size_t size, ColorMode mode,
                                    const SourceArea& area, const ResampleOutput& out,
                                    bool scaled, const std::string& where);
};

// The row whose signature `data` starts with; kData naming `where` (and the
// formats there are) when none does.
const ImageCodec& sniff_image(const uint8_t* data, size_t size, const std::string& where);

// Throws kData naming `where` for 0-sized images and images above max_image_pixels().
void check_image_size(const char* format, int64_t width, int64_t height,
                      const std::string& where);

// Throws kUsage naming `where` unless `region` is a non-empty window inside a
// height x width image.
void check_region(const Window& region, int height, int width, const std::string& where);

// Memory for one image at a time, reused by the thread's next image: each
// user keeps its own as a thread_local. A buffer grown past kKeepBytes is let
// go at the next call, so that one huge image does not pin its size for the
// thread's life.
class ScratchBuffer {
 public:
  uint8_t* get(size_t bytes);

 private:
  static constexpr size_t kKeepBytes = size_t{64} << 20;
  std::vector<uint8_t> bytes_;
};

// Pillow's conversions, bit for bit (libImaging/Convert.c): convert("L") is
// ITU-R 601-2 luma in 16.16 fixed point with rounding; convert("RGB") of a
// CMYK image is nk - nk*C/255 per channel with nk = 255 - K. rgb_to_l may
// write over its input (l == rgb): pixel i is read before l[i] is written.
void rgb_to_l(const uint8_t* rgb, uint8_t* l, size_t pixels);
void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, size_t pixels);
void cmyk_to_l(const uint8_t* cmyk, uint8_t* l, size_t pixels);

}  // namespace detail

}  // namespace chute

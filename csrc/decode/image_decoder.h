// JPEG (libjpeg-turbo, JDCT_ISLOW + fancy upsampling: Pillow's settings, so
// output is pixel-identical) and PNG (libpng) decoding into caller memory.
// Decoder state is kept per thread. Errors are kData naming `where`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace chute {

enum class ImageFormat : uint8_t { kJpeg, kPng };
enum class ColorMode : uint8_t { kRgb, kGray };  // Pillow's convert("RGB") / convert("L")

struct ImageInfo {
  ImageFormat format;
  int width;
  int height;
};

// Reads only the header. Rejects 0-sized images and images above
// kMaxImagePixels (a decompression bomb guard).
constexpr int64_t kMaxImagePixels = int64_t{1} << 28;
ImageInfo probe_image(const uint8_t* data, size_t size, const std::string& where);

// Decodes the whole image as 8-bit HWC (C = 3 for kRgb, 1 for kGray) into
// `out`, which holds info.height * info.width * C bytes.
void decode_image(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                  const std::string& where);

}  // namespace chute

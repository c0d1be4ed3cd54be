// WebP (libwebp), pixel-identical to Pillow's convert("RGB") / convert("L")
// of the same libwebp's decode: the WebP row of image_decoder.cc's table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "decode/image_decoder.h"

namespace chute::detail {

bool is_webp(const uint8_t* data, size_t size);
ImageSize probe_webp(const uint8_t* data, size_t size, const std::string& where);
void decode_webp(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                 const std::string& where);
// kCrop and kCropScaled alike: libwebp's crop of the rows and columns the
// resample reads (plus a margin), the same pixels as a whole decode there.
RegionDecodeInfo decode_webp_region(const uint8_t* data, size_t size, ColorMode mode,
                                    const SourceArea& area, const ResampleOutput& out,
                                    bool scaled, const std::string& where);

}  // namespace chute::detail

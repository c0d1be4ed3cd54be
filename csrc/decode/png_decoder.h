// PNG (libpng), pixel-identical to Pillow's convert("RGB") / convert("L"):
// the PNG row of image_decoder.cc's table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "decode/image_decoder.h"

namespace chute::detail {

bool is_png(const uint8_t* data, size_t size);
ImageSize probe_png(const uint8_t* data, size_t size, const std::string& where);
void decode_png(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                const std::string& where);

}  // namespace chute::detail

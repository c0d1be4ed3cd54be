// JPEG (libjpeg-turbo, JDCT_ISLOW + fancy upsampling: Pillow's settings, so
// output is pixel-identical): the JPEG row of image_decoder.cc's table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "decode/image_decoder.h"

namespace chute::detail {

bool is_jpeg(const uint8_t* data, size_t size);
ImageSize probe_jpeg(const uint8_t* data, size_t size, const std::string& where);
void decode_jpeg(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                 const std::string& where);
// Each group of rows libjpeg produces, from a buffer that stays in L1, so
// that a layout change such as HWC -> CHW happens while the rows are hot.
void decode_jpeg_rows(const uint8_t* data, size_t size, ColorMode mode, RowSink& sink,
                      const std::string& where);
// kCrop, or kCropScaled (DCT scaling) when `scaled`.
RegionDecodeInfo decode_jpeg_region(const uint8_t* data, size_t size, ColorMode mode,
                                    const SourceArea& area, const ResampleOutput& out,
                                    bool scaled, const std::string& where);
// The entropy-decoding part of decode_jpeg only (coefficients, no pixels):
// a benchmark's floor for region decoding.
void entropy_decode_jpeg(const uint8_t* data, size_t size, const std::string& where);

}  // namespace chute::detail

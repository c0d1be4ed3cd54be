// Interleaved RGB to three planes: the CHW layout's whole cost for uint8
// output (pixel_format.cc's row writer).
#pragma once

#include <cstddef>
#include <cstdint>

namespace chute {

// n pixels of `src` (RGB, 3n bytes) into r[0..n), g[0..n), b[0..n).
void split_rgb(const uint8_t* src, size_t n, uint8_t* r, uint8_t* g, uint8_t* b);

}  // namespace chute

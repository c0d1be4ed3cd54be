// The hand-off between a decoder and whatever lays its pixels out: the
// decoder produces a few rows at a time into a small buffer and passes them
// on while they are still in L1, instead of writing a whole HWC image that a
// second pass reads back from L2/memory (for a 256x256 RGB image that second
// pass cost as much as a quarter of the decode).
#pragma once

#include <cstddef>
#include <cstdint>

namespace chute {

class RowSink {
 public:
  // Called once, before any rows, with the decoded image's size and the
  // number of interleaved channels per pixel. Throws to refuse the image.
  virtual void begin(int height, int width, int channels) = 0;
  // Rows [first_row, first_row + count) of the image, HWC, width * channels
  // bytes each, row r at hwc + r * stride. Valid only during the call.
  virtual void rows(const uint8_t* hwc, size_t stride, int first_row, int count) = 0;

 protected:
  ~RowSink() = default;  // never owned through this interface
};

}  // namespace chute

// Filter taps of one resampling axis: for each output pixel, the first
// source pixel it reads and its fixed-point weights. Internal to the resampler.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace chute {

struct AxisTaps {
  int out_size = 0;
  // Weights per output pixel in `weights`: a multiple of 16, zero-padded, so
  // a SIMD kernel may read a whole vector of weights past `count`.
  int stride = 0;
  // Weights are w * 2^precision, rounded; the largest precision (<= 22, as
  // Pillow's) whose largest weight fits an int16, for the multiply-add units.
  int precision = 0;
  int max_count = 0;  // the largest count
  // Every output pixel reads one source pixel with weight 1, source pixel
  // start[0] + i for output i: the axis is a plain copy.
  bool copy = false;
  std::vector<int32_t> start;  // first source pixel, from the readable range's start
  std::vector<int32_t> count;  // taps, >= 1
  std::vector<int16_t> weights;
};

// Taps for `out_size` pixels covering [in0, in1) of a readable range of
// in_size pixels (0 <= in0 < in1 <= in_size). Cached per thread by exact
// arguments, so a stream of equal-sized images builds its tables once.
std::shared_ptr<const AxisTaps> axis_taps(int in_size, double in0, double in1, int out_size);

}  // namespace chute

// The resampler's inner loops, per instruction set. Every kernel computes
// the same integers: per output value, 2^(precision-1) plus the sum of
// weight * byte over the taps, shifted right by precision and clamped to
// [0, 255]. Internal to the resampler.
#pragma once

#include <cstddef>
#include <cstdint>

#include "image/resample.h"
#include "image/resample_taps.h"

namespace chute {

// Bytes a horizontal kernel's `dst` must have writable past its last pixel.
constexpr size_t kKernelRowSlack = 32;

// One source row to taps.out_size pixels of `channels` bytes. `src` points
// at pixel `origin` of the taps' readable range (taps.start counts from that
// range's pixel 0), and `available` pixels may be read from `src`. With
// `flip`, output pixel i is written at position out_size - 1 - i.
using HorizontalKernel = void (*)(const uint8_t* src, int origin, int available,
                                  const AxisTaps& taps, bool flip, uint8_t* dst);

// The horizontal pass of kRowsAtOnce rows that share one readable width:
// src[r] to dst[r], each as a HorizontalKernel call would write it. Kernels
// for RGB that load each output pixel's taps and weights once for all rows.
constexpr int kRowsAtOnce = 4;
using HorizontalRowsKernel = void (*)(const uint8_t* const* src, int origin, int available,
                                      const AxisTaps& taps, bool flip, uint8_t* const* dst);

// `count` rows of `bytes` weighted into `dst` (`bytes` long). Reads and
// writes nothing past `bytes`.
using VerticalKernel = void (*)(const uint8_t* const* rows, const int16_t* weights, int count,
                                int precision, size_t bytes, uint8_t* dst);

struct ResampleKernelSet {
  HorizontalKernel horizontal_gray;
  HorizontalKernel horizontal_rgb;
  VerticalKernel vertical;
  HorizontalRowsKernel horizontal_rgb_rows = nullptr;  // nullptr: one row at a time
};

// The kernels of `level` (kAuto: the best this CPU runs). A level the CPU
// lacks is kUsage.
const ResampleKernelSet& resample_kernels(SimdLevel level);

}  // namespace chute

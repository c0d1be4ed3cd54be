// How a finished uint8 image row is written into a batch: layout (HWC or
// CHW), element type (uint8, float32, float16, bfloat16) and an optional
// per-channel normalisation. The float values are what torchvision's
// ToTensor() then Normalize(mean, std) compute in float32 — v / 255, minus
// mean, divided by std, each step rounded to float32 — and float16/bfloat16
// are that float32 value rounded to nearest-even, as torch's .to() does.
// Every value depends only on (channel, byte), so the conversion is a table
// built once per format.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "image/byte_lookup.h"

namespace chute {

enum class Layout : uint8_t { kHWC, kCHW };
enum class PixelType : uint8_t { kUint8, kFloat32, kFloat16, kBFloat16 };

class OutputFormat {
 public:
  // HWC uint8: the decoded bytes as they are.
  OutputFormat() = default;
  // Float types hold v / 255 (webdataset's and ToTensor's scaling).
  OutputFormat(Layout layout, PixelType type);
  // Float types only (kUsage otherwise): (v / 255 - mean[c]) / std[c]. A gray
  // image uses channel 0. std must be non-zero.
  OutputFormat(Layout layout, PixelType type, const std::array<float, 3>& mean,
               const std::array<float, 3>& std);

  Layout layout() const { return layout_; }
  PixelType type() const { return type_; }
  size_t element_size() const;

  // Writes row y (out_w pixels of `channels` interleaved bytes) of an
  // out_h x out_w image into `out`, which holds the whole image in this
  // format. channels is 1 or 3. `vector` false keeps the float types to the
  // plain per-value loop (tests compare the two).
  void write_row(const uint8_t* row, int channels, int out_h, int out_w, int y, void* out,
                 bool vector = true) const;

 private:
  void build_tables(const std::array<float, 3>& mean, const std::array<float, 3>& std);

  Layout layout_ = Layout::kHWC;
  PixelType type_ = PixelType::kUint8;
  bool normalized_ = false;
  // Per channel: the float32 value of each byte (float32 outputs), or its
  // float16/bfloat16 bits (those outputs).
  std::array<ByteTable<float>, 3> f32_{};
  std::array<ByteTable<uint16_t>, 3> u16_{};
};

// IEEE binary16 and bfloat16 bits of a float32, rounded to nearest-even (NaN
// stays NaN, overflow becomes infinity), bit for bit what torch's conversions give.
uint16_t float_to_half_bits(float value);
uint16_t float_to_bfloat16_bits(float value);

}  // namespace chute

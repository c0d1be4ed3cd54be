#include "image/pixel_format.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "image/split_rgb.h"

namespace chute {

uint16_t float_to_half_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (magnitude >= 0x38800000u) {
    // A normal half (or an overflow): drop 13 mantissa bits rounding to
    // nearest-even; a carry runs into the exponent, which is what rounding
    // up to the next binade means. Then rebias the exponent from 127 to 15.
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    const uint32_t half = (rounded >> 13) - (uint32_t{127 - 15} << 10);
    return sign | static_cast<uint16_t>(half >= 0x7c00u ? 0x7c00u : half);
  }
  // Subnormal half: a multiple of 2^-24. Scaling by 2^24 is exact, and
  // nearbyint rounds half to even in the default rounding mode.
  float abs_value;
  std::memcpy(&abs_value, &magnitude, sizeof(abs_value));
  return sign | static_cast<uint16_t>(std::nearbyint(abs_value * 16777216.0f));
}

uint16_t float_to_bfloat16_bits(float value) {
  if (std::isnan(value)) return 0x7fc0u;
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint32_t bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + bias) >> 16);
}

OutputFormat::OutputFormat(Layout layout, PixelType type) : layout_(layout), type_(type) {
  build_tables({0.0f, 0.0f, 0.0f}, {1.0f, 1.0f, 1.0f});
}

OutputFormat::OutputFormat(Layout layout, PixelType type, const std::array<float, 3>& mean,
                           const std::array<float, 3>& std)
    : layout_(layout), type_(type), normalized_(true) {
  CHUTE_CHECK(type != PixelType::kUint8, kUsage,
              "normalisation needs a float output type (float32, float16 or bfloat16)");
  for (int c = 0; c < 3; ++c) {
    CHUTE_CHECK(std::isfinite(mean[c]) && std::isfinite(std[c]) && std[c] != 0.0f, kUsage,
                "normalisation needs finite means and finite non-zero standard deviations");
  }
  build_tables(mean, std);
}

size_t OutputFormat::element_size() const {
  switch (type_) {
    case PixelType::kUint8:
      return 1;
    case PixelType::kFloat32:
      return 4;
    case PixelType::kFloat16:
    case PixelType::kBFloat16:
      return 2;
  }
  return 1;
}

void OutputFormat::build_tables(const std::array<float, 3>& mean,
                                const std::array<float, 3>& std) {
  if (type_ == PixelType::kUint8) return;
  for (int c = 0; c < 3; ++c) {
    std::array<float, 256> values{};
    std::array<uint16_t, 256> bits{};
    for (int v = 0; v < 256; ++v) {
      // Separate float32 steps, as torch runs them: div(255), sub_(mean), div_(std).
      float x = static_cast<float>(v) / 255.0f;
      if (normalized_) {
        x = x - mean[c];
        x = x / std[c];
      }
      values[v] = x;
      if (type_ == PixelType::kFloat16) bits[v] = float_to_half_bits(x);
      if (type_ == PixelType::kBFloat16) bits[v] = float_to_bfloat16_bits(x);
    }
    if (type_ == PixelType::kFloat32) {
      f32_[c] = ByteTable<float>(values);
    } else {
      u16_[c] = ByteTable<uint16_t>(bits);
    }
  }
}

namespace {

template <typename T, typename Table, int C, bool CHW>
void write_mapped(const uint8_t* row, const std::array<Table, 3>& table, int out_w, size_t plane,
                  T* dst) {
  if constexpr (CHW) {
    for (int c = 0; c < C; ++c) {
      const Table& t = table[c];
      T* d = dst + c * plane;
      for (int x = 0; x < out_w; ++x) d[x] = t[row[x * C + c]];
    }
  } else {
    for (int x = 0; x < out_w; ++x) {
      for (int c = 0; c < C; ++c) dst[x * C + c] = table[c][row[x * C + c]];
    }
  }
}

template <typename T, typename Table>
void write_mapped_any(const uint8_t* row, const std::array<Table, 3>& table, int channels,
                      bool chw, int out_w, size_t plane, T* dst) {
  if (channels == 1) {
    write_mapped<T, Table, 1, false>(row, table, out_w, plane, dst);
  } else if (chw) {
    write_mapped<T, Table, 3, true>(row, table, out_w, plane, dst);
  } else {
    write_mapped<T, Table, 3, false>(row, table, out_w, plane, dst);
  }
}

// The float types through the vector lookup: one plane per channel (CHW
// splits the row first; gray is its own plane). HWC RGB interleaves the
// three channels' tables and keeps to the per-value loop.
template <typename T>
void write_planes(const uint8_t* row, const std::array<ByteTable<T>, 3>& table, int channels,
                  int out_w, size_t plane, T* dst) {
  const size_t n = static_cast<size_t>(out_w);
  if (channels == 1) {
    table[0].map(row, n, dst);
    return;
  }
  thread_local std::vector<uint8_t> planes;
  if (planes.size() < 3 * n) planes.resize(3 * n);
  uint8_t* p = planes.data();
  split_rgb(row, n, p, p + n, p + 2 * n);
  for (int c = 0; c < 3; ++c) table[c].map(p + c * n, n, dst + c * plane);
}

template <typename T>
void write_floats(const uint8_t* row, const std::array<ByteTable<T>, 3>& table, int channels,
                  bool chw, bool vector, int out_w, size_t plane, T* dst) {
  if (vector && (chw || channels == 1) && ByteTable<T>::vectorized()) {
    write_planes(row, table, channels, out_w, plane, dst);
  } else {
    write_mapped_any(row, table, channels, chw, out_w, plane, dst);
  }
}

}  // namespace

void OutputFormat::write_row(const uint8_t* row, int channels, int out_h, int out_w, int y,
                             void* out, bool vector) const {
  const bool chw = layout_ == Layout::kCHW && channels == 3;
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  // Where the row starts: in the first plane for CHW, else at its pixels.
  const size_t offset =
      static_cast<size_t>(y) * out_w * (chw ? 1 : static_cast<size_t>(channels));
  switch (type_) {
    case PixelType::kUint8: {
      uint8_t* dst = static_cast<uint8_t*>(out) + offset;
      if (chw) {
        split_rgb(row, out_w, dst, dst + plane, dst + 2 * plane);
      } else {
        std::memcpy(dst, row, static_cast<size_t>(out_w) * channels);
      }
      return;
    }
    case PixelType::kFloat32:
      write_floats(row, f32_, channels, chw, vector, out_w, plane,
                   static_cast<float*>(out) + offset);
      return;
    case PixelType::kFloat16:
    case PixelType::kBFloat16:
      write_floats(row, u16_, channels, chw, vector, out_w, plane,
                   static_cast<uint16_t*>(out) + offset);
      return;
  }
}

}  // namespace chute

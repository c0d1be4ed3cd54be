// A 16-bit value per byte value, looked up for a run of bytes: the float16
// and bfloat16 writes of pixel_format.cc, whose every value depends only on
// (channel, byte). With AVX-512 VBMI a 64-byte block takes a few byte
// permutes instead of 64 dependent loads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace chute {

class ByteToU16Table {
 public:
  ByteToU16Table() = default;
  explicit ByteToU16Table(const std::array<uint16_t, 256>& values);

  uint16_t operator[](uint8_t byte) const { return values_[byte]; }
  // out[i] = (*this)[in[i]] for i < n.
  void map(const uint8_t* in, size_t n, uint16_t* out) const;
  // Whether map() runs the vector loop on this CPU (else a plain one, no
  // faster than a caller's own loop over operator[]).
  static bool vectorized();

 private:
  std::array<uint16_t, 256> values_{};
  // The values' low and high bytes, each 256 bytes: four 64-byte tables
  // for the permutes.
  std::array<uint8_t, 256> low_{};
  std::array<uint8_t, 256> high_{};
};

}  // namespace chute

// A value per byte value, looked up for a run of bytes: the float writes of
// pixel_format.cc, whose every value depends only on (channel, byte). With
// AVX-512 VBMI a block of 64 bytes takes a few byte permutes per byte of
// the value instead of 64 dependent loads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace chute {

// T: uint16_t (float16/bfloat16 bits) or float.
template <typename T>
class ByteTable {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "2- or 4-byte values");

 public:
  ByteTable() = default;
  explicit ByteTable(const std::array<T, 256>& values);

  T operator[](uint8_t byte) const { return values_[byte]; }
  // out[i] = (*this)[in[i]] for i < n.
  void map(const uint8_t* in, size_t n, T* out) const;
  // Whether map() runs the vector loop on this CPU (else a plain one, no
  // faster than a caller's own loop over operator[]).
  static bool vectorized();

 private:
  std::array<T, 256> values_{};
  // Byte k of every value (little-endian order), for the permutes.
  std::array<std::array<uint8_t, 256>, sizeof(T)> bytes_{};
};

extern template class ByteTable<uint16_t>;
extern template class ByteTable<float>;

}  // namespace chute

// Test-only: .npy payloads written byte by byte as numpy writes them, for
// the field decoder and composition tests (npy_field_test.cc, compose/).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace chute::test {

// A version 1.0 .npy file: magic, version, little-endian header length, the
// header dict padded with spaces so the data starts on a 64-byte boundary,
// '\n', then `data`. `dict` is the header text, e.g.
// "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }".
inline std::string npy_file(const std::string& dict, const std::string& data) {
  constexpr size_t kPrefix = 10;  // magic (6), version (2), header length (2)
  std::string header = dict;
  while ((kPrefix + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>((header.size() >> 8) & 0xff));
  return out + header + data;
}

// The bytes of `values` as they lie in memory (this machine's order).
template <typename T>
std::string raw_bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// The same values with each one's bytes in the other order.
template <typename T>
std::string swapped_bytes(const std::vector<T>& values) {
  std::string out = raw_bytes(values);
  for (size_t i = 0; i < out.size(); i += sizeof(T)) {
    for (size_t b = 0; b < sizeof(T) / 2; ++b) std::swap(out[i + b], out[i + sizeof(T) - 1 - b]);
  }
  return out;
}

}  // namespace chute::test

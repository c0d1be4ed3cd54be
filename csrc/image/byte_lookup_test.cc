#include "image/byte_lookup.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/random.h"

namespace chute {
namespace {

template <typename T>
using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>;

template <typename T>
T from_bits(Bits<T> bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

// Random values, none of whose bits equal `sentinel`'s.
template <typename T>
ByteTable<T> random_table(Rng& rng, Bits<T> sentinel) {
  std::array<T, 256> values{};
  for (T& v : values) {
    Bits<T> bits = sentinel;
    while (bits == sentinel) bits = static_cast<Bits<T>>(rng.next());
    v = from_bits<T>(bits);
  }
  return ByteTable<T>(values);
}

// The vector loop takes 64 bytes a block and masks the last (whose masked
// lanes look up entry 0); the values past n must stay as they were.
template <typename T>
void expect_map_equals_lookup() {
  Rng rng(7);
  const Bits<T> sentinel_bits = 0x5a5a;
  const ByteTable<T> table = random_table<T>(rng, sentinel_bits);
  const T sentinel = from_bits<T>(sentinel_bits);
  for (size_t n : {0, 1, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 129, 224, 500}) {
    std::vector<uint8_t> in(n);
    for (uint8_t& b : in) b = static_cast<uint8_t>(rng.next());
    std::vector<T> out(n + 40, sentinel);
    table.map(in.data(), n, out.data());
    for (size_t i = 0; i < n; ++i) {
      const T want = table[in[i]];
      ASSERT_EQ(std::memcmp(&out[i], &want, sizeof(T)), 0) << "n=" << n << " i=" << i;
    }
    for (size_t i = n; i < out.size(); ++i) {
      ASSERT_EQ(std::memcmp(&out[i], &sentinel, sizeof(T)), 0) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ByteLookup, MapEqualsThePerValueLookupAtEveryLengthAroundTheBlockSize) {
  expect_map_equals_lookup<uint16_t>();
  expect_map_equals_lookup<float>();
}

TEST(ByteLookup, EveryByteValueFindsItsOwnEntry) {
  std::array<uint16_t, 256> values{};
  for (int v = 0; v < 256; ++v) values[v] = static_cast<uint16_t>(0x101 * v ^ 0x8000);
  const ByteTable<uint16_t> table(values);
  std::vector<uint8_t> in(256);
  for (int v = 0; v < 256; ++v) in[v] = static_cast<uint8_t>(255 - v);
  std::vector<uint16_t> out(256);
  table.map(in.data(), in.size(), out.data());
  for (int v = 0; v < 256; ++v) EXPECT_EQ(out[v], values[255 - v]);
}

}  // namespace
}  // namespace chute

#include "image/byte_lookup.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

#include "core/random.h"

namespace chute {
namespace {

ByteToU16Table random_table(Rng& rng) {
  std::array<uint16_t, 256> values{};
  for (uint16_t& v : values) v = static_cast<uint16_t>(rng.next());
  return ByteToU16Table(values);
}

TEST(ByteLookup, MapEqualsThePerValueLookupAtEveryLengthAroundTheBlockSize) {
  // The vector loop takes 64 bytes a block and masks the last; the values
  // past n must stay as they were.
  Rng rng(7);
  const ByteToU16Table table = random_table(rng);
  for (size_t n : {0, 1, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 224, 500}) {
    std::vector<uint8_t> in(n);
    for (uint8_t& b : in) b = static_cast<uint8_t>(rng.next());
    std::vector<uint16_t> out(n + 40, 0xbeef);
    table.map(in.data(), n, out.data());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], table[in[i]]) << "n=" << n << " i=" << i;
    for (size_t i = n; i < out.size(); ++i) ASSERT_EQ(out[i], 0xbeef) << "n=" << n << " i=" << i;
  }
}

TEST(ByteLookup, EveryByteValueFindsItsOwnEntry) {
  std::array<uint16_t, 256> values{};
  for (int v = 0; v < 256; ++v) values[v] = static_cast<uint16_t>(0x101 * v ^ 0x8000);
  const ByteToU16Table table(values);
  std::vector<uint8_t> in(256);
  for (int v = 0; v < 256; ++v) in[v] = static_cast<uint8_t>(255 - v);
  std::vector<uint16_t> out(256);
  table.map(in.data(), in.size(), out.data());
  for (int v = 0; v < 256; ++v) EXPECT_EQ(out[v], values[255 - v]);
}

}  // namespace
}  // namespace chute

#include "io/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace chute {
namespace {

TEST(Crc32c, KnownValues) {
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c(0, "", 0), 0u);
  const std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720, B.4
}

TEST(Crc32c, FastPathEqualsTheTableOverEveryLengthAndSplit) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(3 * 4096 * 2 + 100);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{4095}, size_t{12288},
                   size_t{12289}, size_t{24575}, data.size()}) {
    const uint32_t whole = crc32c_portable(0, data.data(), n);
    EXPECT_EQ(crc32c(0, data.data(), n), whole) << n;
    for (size_t split : {size_t{0}, n / 3, n / 2, n}) {
      const uint32_t first = crc32c(0, data.data(), split);
      EXPECT_EQ(crc32c(first, data.data() + split, n - split), whole) << n << " " << split;
    }
  }
}

TEST(Crc32c, OneChangedByteChangesIt) {
  std::vector<uint8_t> data(100000, 0x5a);
  const uint32_t before = crc32c(0, data.data(), data.size());
  data[54321] ^= 1;
  EXPECT_NE(crc32c(0, data.data(), data.size()), before);
}

}  // namespace
}  // namespace chute

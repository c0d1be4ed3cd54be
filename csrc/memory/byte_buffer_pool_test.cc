#include "memory/byte_buffer_pool.h"

#include <gtest/gtest.h>

#include <vector>

namespace chute {
namespace {

std::vector<uint8_t> with_capacity(size_t n) {
  std::vector<uint8_t> v;
  v.reserve(n);
  v.push_back(1);
  return v;
}

TEST(ByteBufferPool, EmptyPoolGivesAnEmptyBuffer) {
  ByteBufferPool pool(1 << 20, 1 << 16);
  const std::vector<uint8_t> v = pool.take();
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.capacity(), 0u);
}

TEST(ByteBufferPool, AReturnedBufferComesBackClearedWithItsCapacity) {
  ByteBufferPool pool(1 << 20, 1 << 16);
  std::vector<uint8_t> v = with_capacity(1000);
  const uint8_t* memory = v.data();
  pool.give(std::move(v));
  const std::vector<uint8_t> again = pool.take();
  EXPECT_TRUE(again.empty());
  EXPECT_GE(again.capacity(), 1000u);
  EXPECT_EQ(again.data(), memory);
  EXPECT_EQ(pool.take().capacity(), 0u);  // it was the only one
}

TEST(ByteBufferPool, HugeBuffersAreNotKept) {
  ByteBufferPool pool(1 << 20, 4096);
  pool.give(with_capacity(8192));
  EXPECT_EQ(pool.take().capacity(), 0u);
  pool.give(std::vector<uint8_t>{});  // nothing to keep either
  EXPECT_EQ(pool.take().capacity(), 0u);
}

TEST(ByteBufferPool, HoldsAtMostMaxBytes) {
  ByteBufferPool pool(2500, 4096);
  for (int i = 0; i < 5; ++i) pool.give(with_capacity(1000));
  int kept = 0;
  while (pool.take().capacity() > 0) ++kept;
  EXPECT_EQ(kept, 2);
}

}  // namespace
}  // namespace chute

#include "batching/batch.h"

#include <gtest/gtest.h>

#include <optional>

#include "core/error.h"
#include "core/testing.h"

namespace chute {
namespace {

TEST(Tensor, MakeTensorAllocatesItsBytes) {
  BatchAllocator allocator;
  const Tensor t = make_tensor(allocator, DType::kF32, {4, 3, 2});
  EXPECT_EQ(t.numel(), 24u);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.offset, 0u);
  ASSERT_NE(t.block, nullptr);
  EXPECT_GE(t.block->size(), 96u);
  EXPECT_EQ(t.data(), t.block->data());
}

TEST(Tensor, ScalarAndEmptyShapes) {
  BatchAllocator allocator;
  const Tensor scalar = make_tensor(allocator, DType::kI64, {});
  EXPECT_EQ(scalar.numel(), 1u);
  EXPECT_EQ(scalar.nbytes(), 8u);
  const Tensor empty = make_tensor(allocator, DType::kU8, {0, 5});
  EXPECT_EQ(empty.numel(), 0u);
  EXPECT_NE(empty.block, nullptr);  // still a valid block to hand to numpy
}

TEST(Tensor, NegativeDimensionIsAUsageError) {
  BatchAllocator allocator;
  const std::optional<Error> e =
      test::error_from([&] { make_tensor(allocator, DType::kU8, {2, -1}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(), "negative dimension -1");
}

}  // namespace
}  // namespace chute

#include "batching/batch_fit.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>

#include "core/error.h"
#include "core/testing.h"

namespace chute {
namespace {

std::optional<Error> fits(int64_t batch_size, size_t max_batch_bytes, size_t sample_bytes,
                          uint64_t memory) {
  return test::error_from(
      [&] { check_batch_fits(batch_size, max_batch_bytes, sample_bytes, memory); });
}

TEST(BatchFit, ABatchThatFitsPasses) {
  EXPECT_FALSE(fits(100, 0, 500, 50000));  // exactly the memory
  EXPECT_FALSE(fits(10, 0, 500, 50000));
}

TEST(BatchFit, ABatchLargerThanTheMemoryIsAUsageError) {
  const std::optional<Error> e = fits(1000, 0, 100, 50000);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(),
            "batch_size 1000 cannot fit: a batch of samples like the first one (100 bytes each, "
            "encoded and decoded) needs about 100000 bytes, more than the 50000 bytes of memory "
            "of this machine");
}

TEST(BatchFit, AnEmptySampleStillTakesAByte) {
  EXPECT_FALSE(fits(50, 0, 0, 50));
  const std::optional<Error> e = fits(51, 0, 0, 50);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("(0 bytes each, encoded and decoded) needs about 51 bytes"),
            std::string::npos)
      << e->message();
}

TEST(BatchFit, ASizePast64BitsIsNamedSo) {
  const std::optional<Error> e = fits(INT64_MAX, 0, size_t{1} << 40, uint64_t{1} << 40);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("needs about more than 2^64 bytes"), std::string::npos)
      << e->message();
}

TEST(BatchFit, NothingIsCheckedWithoutAMemoryOrABatchOfSeveralSamples) {
  EXPECT_FALSE(fits(1000, 0, 100, 0));         // memory unknown
  EXPECT_FALSE(fits(1, 0, 100000, 50000));     // one sample goes alone
  EXPECT_FALSE(fits(1000, 4096, 100, 50000));  // batches cut by bytes
}

TEST(BatchFit, ThisMachineHasMemory) { EXPECT_GT(physical_memory(), 0u); }

}  // namespace
}  // namespace chute

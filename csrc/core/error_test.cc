#include "core/error.h"

#include <gtest/gtest.h>

#include <string>

namespace chute {
namespace {

// The line of the CHUTE_CHECK below, kept next to it so the test names the
// exact location the macro must record.
constexpr int kCheckLine = __LINE__ + 2;
void fail_with_value(int value) {
  CHUTE_CHECK(value == 0, kData, "value " << value << " in shard 'a.tar' at offset " << 512);
}

TEST(Error, CheckThrowsKindMessageAndWhereItWasRaised) {
  try {
    fail_with_value(7);
    FAIL() << "CHUTE_CHECK did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kData);
    EXPECT_EQ(e.message(), "value 7 in shard 'a.tar' at offset 512");
    // The location is the file's base name, not the build machine's path.
    EXPECT_EQ(std::string(e.what()),
              "value 7 in shard 'a.tar' at offset 512 [error_test.cc:" +
                  std::to_string(kCheckLine) + "]");
  }
}

TEST(Error, CheckThatHoldsDoesNotEvaluateItsMessage) {
  int evaluated = 0;
  auto message = [&] {
    ++evaluated;
    return "unused";
  };
  CHUTE_CHECK(1 + 1 == 2, kUsage, message());
  EXPECT_EQ(evaluated, 0);
  EXPECT_THROW(CHUTE_CHECK(false, kUsage, message()), Error);
  EXPECT_EQ(evaluated, 1);
}

TEST(Error, EveryKindSurvivesTheThrow) {
  for (ErrorKind kind : {ErrorKind::kData, ErrorKind::kIo, ErrorKind::kUsage, ErrorKind::kTimeout}) {
    try {
      raise_error(kind, "m", "/some/dir/file.cc", 12);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind);
      EXPECT_EQ(std::string(e.what()), "m [file.cc:12]");
      EXPECT_EQ(e.message(), "m");
    }
  }
}

TEST(Error, IsARuntimeError) {
  // Code that only knows the standard hierarchy (and the bindings' fallback)
  // still sees the full text.
  try {
    raise_error(ErrorKind::kIo, "disk gone", "x.cc", 3);
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "disk gone [x.cc:3]");
    return;
  }
  FAIL() << "not caught as std::runtime_error";
}

TEST(Error, FileWithoutDirectoryKeepsItsName) {
  const Error e(ErrorKind::kTimeout, "slow", "plain.cc", 1);
  EXPECT_EQ(std::string(e.what()), "slow [plain.cc:1]");
}

}  // namespace
}  // namespace chute

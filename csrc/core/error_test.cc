#include "core/error.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "core/testing.h"

namespace chute {
namespace {

// The line of the CHUTE_CHECK below, kept next to it so the test names the
// exact location the macro must record.
constexpr int kCheckLine = __LINE__ + 2;
void fail_with_value(int value) {
  CHUTE_CHECK(value == 0, kData, "value " << value << " in shard 'a.tar' at offset " << 512);
}

// `error` thrown on another thread and caught there as an exception_ptr, as
// engines hand their errors to next().
std::exception_ptr thrown_on_another_thread(const Error& error) {
  std::exception_ptr held;
  std::thread([&] {
    try {
      throw error;
    } catch (...) {
      held = std::current_exception();
    }
  }).join();
  return held;
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

TEST(Error, ScopeAndPlaceAreNotKnownUnlessSet) {
  try {
    fail_with_value(3);
  } catch (const Error& e) {
    EXPECT_EQ(e.scope(), ErrorScope::kOther);
    EXPECT_EQ(e.place().url, "");
    EXPECT_EQ(e.place().member, "");
    EXPECT_EQ(e.place().key, "");
  }
}

TEST(Error, ScopeAndPlaceTravelWithTheErrorNotInItsWords) {
  // Words of a read failure in a member's failure: the scope is what was set.
  const Error e(ErrorKind::kData, "truncated tar archive 'a.tar': cannot open", "jpeg.cc", 4,
                ErrorScope::kMember, {"a.tar", "k.jpg", "k"});
  const Error prefixed = e.with_prefix("shard 'a.tar': ");
  EXPECT_EQ(prefixed.scope(), ErrorScope::kMember);
  EXPECT_EQ(prefixed.place().url, "a.tar");
  EXPECT_EQ(prefixed.place().member, "k.jpg");
  EXPECT_EQ(prefixed.place().key, "k");
  EXPECT_STREQ(prefixed.file(), "jpeg.cc");
  // Copied into an exception_ptr and rethrown on another thread (as engines
  // hand their errors to next()): nothing is lost.
  std::exception_ptr held = thrown_on_another_thread(prefixed);
  try {
    std::rethrow_exception(held);
  } catch (const Error& again) {
    EXPECT_EQ(again.scope(), ErrorScope::kMember);
    EXPECT_EQ(again.place().member, "k.jpg");
    EXPECT_EQ(again.message(), "shard 'a.tar': truncated tar archive 'a.tar': cannot open");
  }
}

TEST(Error, ScopedSetsOnlyWhatIsNotKnownYet) {
  const Error plain(ErrorKind::kIo, "read error", "file_source.cc", 40);
  const Error read = plain.scoped(ErrorScope::kRead, {"a.tar", "", ""});
  EXPECT_EQ(read.scope(), ErrorScope::kRead);
  EXPECT_EQ(read.place().url, "a.tar");
  EXPECT_EQ(read.kind(), ErrorKind::kIo);
  EXPECT_EQ(read.message(), "read error");
  EXPECT_EQ(read.line(), 40);
  // Code further out keeps the scope and fields set nearer the failure and
  // fills in the rest.
  const Error outer = read.scoped(ErrorScope::kMember, {"b.tar", "k.jpg", "k"});
  EXPECT_EQ(outer.scope(), ErrorScope::kRead);
  EXPECT_EQ(outer.place().url, "a.tar");
  EXPECT_EQ(outer.place().member, "k.jpg");
  EXPECT_EQ(outer.place().key, "k");
}

// The line of the check below, as for kCheckLine.
constexpr int kOsCheckLine = __LINE__ + 2;
void fail_to_open(int err) {
  CHUTE_CHECK(false, kIo, "cannot open 'a.tar'" << OsFailure(err, "/data/a.tar"));
}

TEST(Error, OsFailureGivesTheWordsAndTheNumber) {
  const std::optional<Error> e = test::error_from([] { fail_to_open(ENOENT); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "cannot open 'a.tar': No such file or directory");
  EXPECT_EQ(e->os_failure().number, ENOENT);
  EXPECT_EQ(e->os_failure().path, "/data/a.tar");
  EXPECT_EQ(e->line(), kOsCheckLine);
  // Other failures come from no system call.
  const std::optional<Error> other = test::error_from([] { fail_with_value(1); });
  ASSERT_TRUE(other);
  EXPECT_EQ(other->os_failure().number, 0);
  EXPECT_EQ(other->os_failure().path, "");
}

TEST(Error, OsFailureOfNumberZeroAddsNothing) {
  const std::optional<Error> e = test::error_from([] { fail_to_open(0); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "cannot open 'a.tar'");
  EXPECT_EQ(e->os_failure().number, 0);
  EXPECT_EQ(e->os_failure().path, "");
}

TEST(Error, OsFailureOutsideACheckIsWordsOnly) {
  std::ostringstream os;
  os << "x" << OsFailure(EIO, "/p");
  EXPECT_EQ(os.str(), "x: Input/output error");
}

TEST(Error, OsFailureSurvivesPrefixScopeAndRethrowOnAnotherThread) {
  const std::optional<Error> raised = test::error_from([] { fail_to_open(EACCES); });
  ASSERT_TRUE(raised);
  const Error outer =
      raised->with_prefix("shard 3: ").scoped(ErrorScope::kRead, {"s3://b/a.tar", "", ""});
  std::exception_ptr held = thrown_on_another_thread(outer);
  try {
    std::rethrow_exception(held);
  } catch (const Error& again) {
    EXPECT_EQ(again.message(), "shard 3: cannot open 'a.tar': Permission denied");
    EXPECT_EQ(again.os_failure().number, EACCES);
    EXPECT_EQ(again.os_failure().path, "/data/a.tar");
    EXPECT_EQ(again.place().url, "s3://b/a.tar");
    EXPECT_EQ(again.scope(), ErrorScope::kRead);
  }
}

TEST(Error, FileWithoutDirectoryKeepsItsName) {
  const Error e(ErrorKind::kTimeout, "slow", "plain.cc", 1);
  EXPECT_EQ(std::string(e.what()), "slow [plain.cc:1]");
}

}  // namespace
}  // namespace chute

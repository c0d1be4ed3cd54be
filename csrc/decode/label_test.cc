#include "decode/label.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/testing.h"

namespace chute {
namespace {

int64_t label(const std::string& s) {
  return parse_int_label(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "s.cls");
}

std::string error_of(const std::string& s) {
  const std::optional<Error> e = test::error_from([&] { label(s); });
  if (!e) return "<no error>";
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  return e->message();
}

TEST(IntLabel, ReadsWhatPythonsIntReads) {
  EXPECT_EQ(label("0"), 0);
  EXPECT_EQ(label("42"), 42);
  EXPECT_EQ(label("  42\n"), 42);
  EXPECT_EQ(label("\t\v\f\r-7 "), -7);
  EXPECT_EQ(label("+3"), 3);
  EXPECT_EQ(label("007"), 7);
  EXPECT_EQ(label("1_000_000"), 1000000);
  EXPECT_EQ(label("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(label("-9223372036854775808"), INT64_MIN);
}

TEST(IntLabel, RefusesWhatPythonsIntRefuses) {
  for (const char* bad : {"", "   ", "-", "+", "1.5", "1e3", "0x10", "_1", "1_", "1__0", "1 2", "--1", "one"}) {
    EXPECT_EQ(error_of(bad), std::string("s.cls: invalid integer label b'") + bad +
                                 "' (expected decimal digits, as Python's int() reads them)")
        << "'" << bad << "'";
  }
}

TEST(IntLabel, OverflowIsAnError) {
  EXPECT_EQ(error_of("9223372036854775808"),
            "s.cls: integer label b'9223372036854775808' does not fit in int64");
  EXPECT_EQ(error_of("-9223372036854775809"),
            "s.cls: integer label b'-9223372036854775809' does not fit in int64");
  EXPECT_EQ(error_of("99999999999999999999999"),
            "s.cls: integer label b'99999999999999999999999' does not fit in int64");
}

TEST(IntLabel, ErrorQuotesTheBytesAsPythonWould) {
  EXPECT_EQ(error_of(std::string("a'\\\n\x01", 5)),
            "s.cls: invalid integer label b'a\\'\\\\\\n\\x01' (expected decimal digits, as Python's "
            "int() reads them)");
  EXPECT_EQ(error_of(std::string(50, 'z')),
            "s.cls: invalid integer label b'" + std::string(40, 'z') +
                "...' (expected decimal digits, as Python's int() reads them)");
}

}  // namespace
}  // namespace chute

#include "decode/label_field.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/testing.h"

namespace chute {
namespace {

ProbedField probe(const LabelFieldDecoder& d, const std::string& payload) {
  ProbedField p;
  p.shape = {7, 7};  // left over from another field's probe
  p.dtype = DType::kF32;
  d.probe(reinterpret_cast<const uint8_t*>(payload.data()), payload.size(), p);
  return p;
}

TEST(LabelField, ProbesAnInt64ScalarHoldingTheValue) {
  const LabelFieldDecoder d;
  const ProbedField p = probe(d, "  42\n");
  EXPECT_EQ(p.dtype, DType::kI64);
  EXPECT_TRUE(p.shape.empty());
  EXPECT_EQ(p.detail[0], 42);
}

TEST(LabelField, DecodesTheProbedValueIntoItsRow) {
  const LabelFieldDecoder d;
  for (const std::string& text : {std::string("0"), std::string("-7"), std::string("1_000"),
                                  std::string("-9223372036854775808")}) {
    const ProbedField p = probe(d, text);
    uint8_t row[sizeof(int64_t) + 4];
    std::memset(row, 0xAB, sizeof row);
    d.decode(reinterpret_cast<const uint8_t*>(text.data()), text.size(), p, RowPosition{}, row);
    int64_t value = 0;
    std::memcpy(&value, row, sizeof value);
    EXPECT_EQ(value, std::stoll(text == "1_000" ? "1000" : text)) << text;
    for (size_t i = sizeof(int64_t); i < sizeof row; ++i) EXPECT_EQ(row[i], 0xAB);
  }
}

TEST(LabelField, ABadLabelFailsWithoutAPlaceOfItsOwn) {
  const LabelFieldDecoder d;
  const std::optional<Error> e = test::error_from([&] { probe(d, "cat"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(),
            ": invalid integer label b'cat' (expected decimal digits, as Python's int() reads them)");
  const std::optional<Error> big = test::error_from([&] { probe(d, "9223372036854775808"); });
  ASSERT_TRUE(big);
  EXPECT_EQ(big->message(), ": integer label b'9223372036854775808' does not fit in int64");
}

}  // namespace
}  // namespace chute

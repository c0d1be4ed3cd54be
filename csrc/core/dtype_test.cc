#include "core/dtype.h"

#include <gtest/gtest.h>

#include <string>

namespace chute {
namespace {

struct DescrCase {
  const char* descr;
  DType type;
  size_t size;
  const char* name;
  bool swap;  // on a little-endian machine
};

TEST(DType, NumpyDescrsMapToTypeSizeNameAndByteOrder) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the table below assumes little-endian");
  const DescrCase cases[] = {
      {"|u1", DType::kU8, 1, "uint8", false},     {"|i1", DType::kI8, 1, "int8", false},
      {"<u2", DType::kU16, 2, "uint16", false},   {">u2", DType::kU16, 2, "uint16", true},
      {"<i2", DType::kI16, 2, "int16", false},    {"<u4", DType::kU32, 4, "uint32", false},
      {">i4", DType::kI32, 4, "int32", true},     {"<u8", DType::kU64, 8, "uint64", false},
      {"=i8", DType::kI64, 8, "int64", false},    {"<f2", DType::kF16, 2, "float16", false},
      {"<f4", DType::kF32, 4, "float32", false},  {">f8", DType::kF64, 8, "float64", true},
      {"?", DType::kBool, 1, "bool", false},      {"|b1", DType::kBool, 1, "bool", false},
      // One-byte types have no byte order, whatever the prefix says.
      {">u1", DType::kU8, 1, "uint8", false},
  };
  for (const DescrCase& c : cases) {
    SCOPED_TRACE(c.descr);
    DType type = DType::kF64;
    bool swap = !c.swap;
    ASSERT_TRUE(dtype_from_numpy_descr(c.descr, &type, &swap));
    EXPECT_EQ(type, c.type);
    EXPECT_EQ(swap, c.swap);
    EXPECT_EQ(dtype_size(type), c.size);
    EXPECT_EQ(std::string(dtype_name(type)), c.name);
  }
}

TEST(DType, RefusesWhatIsNotANumericDescr) {
  for (const char* descr : {"", "f4", "<f16", "<c8", "|O8", "<U4", "|S3", "|V8", "xf4", "<f3", "<b2"}) {
    SCOPED_TRACE(descr);
    DType type;
    bool swap;
    EXPECT_FALSE(dtype_from_numpy_descr(descr, &type, &swap));
  }
}

}  // namespace
}  // namespace chute

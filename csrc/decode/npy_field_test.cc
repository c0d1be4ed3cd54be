#include "decode/npy_field.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "decode/npy_testing.h"

namespace chute {
namespace {

using test::npy_file;
using test::raw_bytes;

const uint8_t* bytes_of(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

ProbedField probe(const FieldDecoder& d, const std::string& payload) {
  ProbedField p;
  d.probe(bytes_of(payload), payload.size(), p);
  return p;
}

// Decodes `payload` (probed as `p`) into a row with guard bytes after it,
// and checks the decoder wrote no further than the row.
template <typename T>
std::vector<T> decode(const FieldDecoder& d, const std::string& payload, const ProbedField& p,
                      size_t count) {
  std::vector<uint8_t> row(count * sizeof(T) + 16, 0xAB);
  d.decode(bytes_of(payload), payload.size(), p, RowPosition{}, row.data());
  for (size_t i = count * sizeof(T); i < row.size(); ++i) EXPECT_EQ(row[i], 0xAB) << "byte " << i;
  std::vector<T> out(count);
  std::memcpy(out.data(), row.data(), count * sizeof(T));
  return out;
}

TEST(NpyField, ProbesDtypeShapeAndWhereTheDataStarts) {
  const NpyFieldDecoder d;
  const std::vector<float> values = {0.5f, 1, 2, 3, 4, 5.25f};
  const std::string payload =
      npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", raw_bytes(values));
  const ProbedField p = probe(d, payload);
  EXPECT_EQ(p.dtype, DType::kF32);
  EXPECT_EQ(p.shape, (std::vector<int64_t>{2, 3}));
  // The array bytes are the payload's last 24: numpy pads the header to a
  // multiple of 64 bytes.
  EXPECT_EQ(p.detail[0], static_cast<int64_t>(payload.size() - 24));
  EXPECT_EQ(p.detail[0] % 64, 0);
  EXPECT_EQ(p.detail[1], 0);
  EXPECT_EQ(p.member, -1);  // which member is the engine's business
  EXPECT_EQ(decode<float>(d, payload, p, 6), values);
}

TEST(NpyField, OtherDtypesAndAScalar) {
  const NpyFieldDecoder d;
  const std::vector<uint16_t> u16 = {1, 65535, 7};
  const std::string a =
      npy_file("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", raw_bytes(u16));
  ProbedField p = probe(d, a);
  EXPECT_EQ(p.dtype, DType::kU16);
  EXPECT_EQ(p.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(decode<uint16_t>(d, a, p, 3), u16);

  const std::vector<double> scalar = {-2.5};
  const std::string b =
      npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", raw_bytes(scalar));
  p = probe(d, b);
  EXPECT_EQ(p.dtype, DType::kF64);
  EXPECT_TRUE(p.shape.empty());
  EXPECT_EQ(decode<double>(d, b, p, 1), scalar);
}

TEST(NpyField, BigEndianAndFortranOrderComeOutNativeAndCOrder) {
  const NpyFieldDecoder d;
  const std::vector<int32_t> values = {1, -2, 300000, 4, 5, -6};
  const std::string swapped = npy_file("{'descr': '>i4', 'fortran_order': False, 'shape': (6,), }",
                                       test::swapped_bytes(values));
  ProbedField p = probe(d, swapped);
  EXPECT_EQ(p.dtype, DType::kI32);
  EXPECT_NE(p.detail[1], 0);
  EXPECT_EQ(decode<int32_t>(d, swapped, p, 6), values);

  // Fortran order: column by column. [[1, 2, 3], [4, 5, 6]] is stored 1 4 2 5 3 6.
  const std::string fortran = npy_file("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }",
                                       raw_bytes(std::vector<int32_t>{1, 4, 2, 5, 3, 6}));
  p = probe(d, fortran);
  EXPECT_EQ(p.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(decode<int32_t>(d, fortran, p, 6), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));

  // Both at once.
  const std::string both = npy_file("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3), }",
                                    test::swapped_bytes(std::vector<int32_t>{1, 4, 2, 5, 3, 6}));
  p = probe(d, both);
  EXPECT_EQ(decode<int32_t>(d, both, p, 6), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
}

TEST(NpyField, AProbeLeavesNothingOfAnEarlierOne) {
  // The engine reuses ProbedField objects from sample to sample.
  const NpyFieldDecoder d;
  const std::string fortran = npy_file("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 2), }",
                                       test::swapped_bytes(std::vector<int32_t>{1, 3, 2, 4}));
  const std::vector<uint8_t> plain_values = {9, 8, 7};
  const std::string plain =
      npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }", raw_bytes(plain_values));
  ProbedField p;
  d.probe(bytes_of(fortran), fortran.size(), p);
  d.probe(bytes_of(plain), plain.size(), p);
  EXPECT_EQ(p.dtype, DType::kU8);
  EXPECT_EQ(p.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(p.detail[1], 0);
  EXPECT_EQ(decode<uint8_t>(d, plain, p, 3), plain_values);
}

TEST(NpyField, BadPayloadsFailWithoutAPlaceOfTheirOwn) {
  // The engine puts the sample's location in front of a message that
  // starts with ": ".
  const NpyFieldDecoder d;
  for (const std::string& payload :
       {std::string("not numpy at all"),
        npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", "short"),
        npy_file("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", "12345678")}) {
    const std::optional<Error> e = test::error_from([&] { probe(d, payload); });
    ASSERT_TRUE(e) << payload;
    EXPECT_EQ(e->kind(), ErrorKind::kData);
    EXPECT_EQ(e->message().substr(0, 2), ": ") << e->message();
  }
  const std::optional<Error> e = test::error_from([&] { probe(d, "not numpy at all"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), ": not a .npy file (no \\x93NUMPY magic)");
}

}  // namespace
}  // namespace chute

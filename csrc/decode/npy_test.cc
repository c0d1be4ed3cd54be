#include "decode/npy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"

namespace chute {
namespace {

// A .npy file as numpy writes it: magic, version, little-endian header
// length, the dict padded with spaces so the data starts on a 64-byte
// boundary, '\n', then `data`.
std::string npy(const std::string& dict, const std::string& data, int major = 1) {
  const size_t prefix = 8 + (major == 1 ? 2 : 4);
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  const size_t len = header.size();
  out.push_back(static_cast<char>(len & 0xff));
  out.push_back(static_cast<char>((len >> 8) & 0xff));
  if (major != 1) {
    out.push_back(static_cast<char>((len >> 16) & 0xff));
    out.push_back(static_cast<char>((len >> 24) & 0xff));
  }
  return out + header + data;
}

template <typename T>
std::string raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// Each value's bytes in the other order.
template <typename T>
std::string swapped(const std::vector<T>& values) {
  std::string out = raw(values);
  for (size_t i = 0; i < out.size(); i += sizeof(T)) {
    for (size_t b = 0; b < sizeof(T) / 2; ++b) std::swap(out[i + b], out[i + sizeof(T) - 1 - b]);
  }
  return out;
}

NpyHeader parse(const std::string& file) {
  return parse_npy_header(reinterpret_cast<const uint8_t*>(file.data()), file.size(), "x.npy");
}

template <typename T>
std::vector<T> decode(const std::string& file) {
  const NpyHeader h = parse(file);
  EXPECT_EQ(h.data_bytes % sizeof(T), 0u);
  std::vector<T> out(h.data_bytes / sizeof(T));
  copy_npy(h, reinterpret_cast<const uint8_t*>(file.data()), reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

// The message of the kData error that parsing `file` raises.
std::string error_of(const std::string& file) {
  const std::optional<Error> e = test::error_from([&] { parse(file); });
  if (!e) return "<no error>";
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  return e->message();
}

// For header errors: the reason, without the position and the quoted header
// that follow it.
std::string header_error(const std::string& dict) {
  const std::string m = error_of(npy(dict, std::string(64, '\0')));
  const size_t at = m.find(" at character ");
  return at == std::string::npos ? m : m.substr(0, at);
}

TEST(Npy, Version1Header) {
  const std::vector<float> values = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const std::string file =
      npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", raw(values));
  const NpyHeader h = parse(file);
  EXPECT_EQ(h.dtype, DType::kF32);
  EXPECT_FALSE(h.byteswap);
  EXPECT_FALSE(h.fortran_order);
  EXPECT_EQ(h.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(h.data_offset, 128u);
  EXPECT_EQ(h.data_bytes, 48u);
  EXPECT_EQ(decode<float>(file), values);
}

TEST(Npy, Versions2And3HaveAFourByteHeaderLength) {
  const std::vector<int32_t> values = {-1, 2, -3};
  for (int major : {2, 3}) {
    const std::string file =
        npy("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", raw(values), major);
    const NpyHeader h = parse(file);
    EXPECT_EQ(h.data_offset, 128u);
    EXPECT_EQ(h.shape, (std::vector<int64_t>{3}));
    EXPECT_EQ(decode<int32_t>(file), values);
  }
}

TEST(Npy, AnyKeyOrderQuotesAndSpacing) {
  const std::string file =
      npy("{ \"shape\" : ( 2 , 3 ) ,\"fortran_order\":False,  \"descr\":\"|u1\"}", "abcdef");
  const NpyHeader h = parse(file);
  EXPECT_EQ(h.dtype, DType::kU8);
  EXPECT_EQ(h.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(decode<char>(file), (std::vector<char>{'a', 'b', 'c', 'd', 'e', 'f'}));
}

TEST(Npy, ScalarAndEmptyArrays) {
  const NpyHeader scalar =
      parse(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", raw(std::vector<double>{2.5})));
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.data_bytes, 8u);
  const std::string empty_file = npy("{'descr': '<f8', 'fortran_order': True, 'shape': (0, 3), }", "");
  const NpyHeader empty = parse(empty_file);
  EXPECT_EQ(empty.shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(empty.data_bytes, 0u);
  uint8_t untouched = 0x5a;
  copy_npy(empty, reinterpret_cast<const uint8_t*>(empty_file.data()), &untouched);
  EXPECT_EQ(untouched, 0x5a);
}

TEST(Npy, BigEndianValuesComeOutNative) {
  const std::vector<int16_t> values = {1, -2, 300, -32768};
  const std::string file =
      npy("{'descr': '>i2', 'fortran_order': False, 'shape': (4,), }", swapped(values));
  EXPECT_TRUE(parse(file).byteswap);
  EXPECT_EQ(decode<int16_t>(file), values);
  const std::vector<double> doubles = {1.5, -1e300};
  EXPECT_EQ(decode<double>(npy("{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }",
                               swapped(doubles))),
            doubles);
}

TEST(Npy, BoolArrays) {
  const std::string file = npy("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",
                               std::string("\x01\x00\x01", 3));
  EXPECT_EQ(parse(file).dtype, DType::kBool);
  EXPECT_EQ(decode<uint8_t>(file), (std::vector<uint8_t>{1, 0, 1}));
}

// The C-order values of an array of `shape` with a[i, j, ...] = its C index,
// and the same array's bytes in Fortran order.
std::vector<int32_t> c_order(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return v;
}

std::vector<int32_t> fortran_order(const std::vector<int64_t>& shape) {
  const std::vector<int32_t> c = c_order(shape);
  std::vector<int32_t> f(c.size());
  const size_t ndim = shape.size();
  for (size_t ci = 0; ci < c.size(); ++ci) {
    // C index -> coordinates -> Fortran index (first axis fastest).
    size_t rest = ci;
    std::vector<size_t> idx(ndim);
    for (size_t k = ndim; k-- > 0;) {
      idx[k] = rest % static_cast<size_t>(shape[k]);
      rest /= static_cast<size_t>(shape[k]);
    }
    size_t fi = 0, stride = 1;
    for (size_t k = 0; k < ndim; ++k) {
      fi += idx[k] * stride;
      stride *= static_cast<size_t>(shape[k]);
    }
    f[fi] = c[ci];
  }
  return f;
}

TEST(Npy, FortranOrderIsCopiedToCOrder) {
  // 2-D by hand: a = [[0, 1, 2], [3, 4, 5]] stored column by column.
  EXPECT_EQ(fortran_order({2, 3}), (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
  const std::vector<std::vector<int64_t>> shapes = {{2, 3}, {3, 2}, {2, 3, 4}, {4, 1, 3}, {2, 2, 2, 3}};
  for (const std::vector<int64_t>& shape : shapes) {
    std::string shape_text = "(";
    for (int64_t d : shape) shape_text += std::to_string(d) + ", ";
    shape_text += ")";
    SCOPED_TRACE(shape_text);
    const std::string file = npy("{'descr': '<i4', 'fortran_order': True, 'shape': " + shape_text + ", }",
                                 raw(fortran_order(shape)));
    EXPECT_TRUE(parse(file).fortran_order);
    EXPECT_EQ(decode<int32_t>(file), c_order(shape));
    const std::string big_endian =
        npy("{'descr': '>i4', 'fortran_order': True, 'shape': " + shape_text + ", }",
            swapped(fortran_order(shape)));
    EXPECT_EQ(decode<int32_t>(big_endian), c_order(shape));
  }
}

TEST(Npy, FortranOrderWithOneLongAxisIsTheSameBytes) {
  const std::vector<int32_t> values = {5, 6, 7, 8, 9};
  EXPECT_EQ(decode<int32_t>(npy("{'descr': '<i4', 'fortran_order': True, 'shape': (1, 5, 1), }",
                                raw(values))),
            values);
}

TEST(Npy, FileErrors) {
  EXPECT_EQ(error_of("PK\x03\x04 not numpy"), "x.npy: not a .npy file (no \\x93NUMPY magic)");
  EXPECT_EQ(error_of(std::string("\x93NUMPY", 6)), "x.npy: not a .npy file (no \\x93NUMPY magic)");
  std::string v4 = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", "1234");
  v4[6] = 4;
  EXPECT_EQ(error_of(v4), "x.npy: unsupported .npy format version 4.0");
  std::string v11 = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", "1234");
  v11[7] = 1;
  EXPECT_EQ(error_of(v11), "x.npy: unsupported .npy format version 1.1");
  EXPECT_EQ(error_of(std::string("\x93NUMPY\x02\x00\x10", 9)), "x.npy: truncated .npy header (9 bytes)");
  const std::string file = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }",
                               std::string(48, '\0'));
  EXPECT_EQ(error_of(file.substr(0, 30)),
            "x.npy: truncated .npy header: it declares 118 bytes, the file has 20 after the prefix");
  EXPECT_EQ(error_of(file.substr(0, file.size() - 1)),
            "x.npy: truncated .npy payload: the header promises 48 bytes of float32, the file has 47");
}

TEST(Npy, HeaderErrors) {
  const std::string bad = "x.npy: bad .npy header: ";
  const std::string object =
      "cannot be loaded without pickle, as np.load(allow_pickle=False) refuses them";
  EXPECT_EQ(header_error("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"),
            bad + "object arrays ('|O', pickled Python objects) " + object);
  EXPECT_EQ(header_error("{'descr': [('a', '<i4'), ('b', [('c', '|O')])], 'fortran_order': False, 'shape': (1,), }"),
            bad + "object arrays ('|O', pickled Python objects) " + object);
  EXPECT_EQ(header_error("{'descr': '<c12', 'fortran_order': False, 'shape': (1,), }"),
            bad + "unsupported dtype '<c12'");
  EXPECT_EQ(header_error("{'descr': '<M8[fortnight]', 'fortran_order': False, 'shape': (1,), }"),
            bad + "unsupported dtype '<M8[fortnight]'");
  EXPECT_EQ(header_error("{'descr': '<q8', 'fortran_order': False, 'shape': (1,), }"),
            bad + "unsupported dtype '<q8'");
  EXPECT_EQ(header_error("{'descr': [], 'fortran_order': False, 'shape': (1,), }"),
            bad + "zero-size dtype");
  EXPECT_EQ(header_error("{'descr': [('a' '<i4')], 'fortran_order': False, 'shape': (1,), }"),
            bad + "expected ','");
  EXPECT_EQ(header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (3), }"),
            bad + "shape must be a tuple: '(n,)', not '(n)'");
  EXPECT_EQ(header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"),
            bad + "shape entries must be non-negative integers");
  EXPECT_EQ(header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }"),
            bad + "shape entry overflows");
  EXPECT_EQ(header_error("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }"),
            bad + "fortran_order must be True or False");
  EXPECT_EQ(header_error("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }"),
            bad + "duplicate key 'descr'");
  EXPECT_EQ(header_error("{'descr': '<f4', 'shape': (1,), }"),
            bad + "missing key (need 'descr', 'fortran_order' and 'shape')");
  EXPECT_EQ(header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}"),
            bad + "unexpected key 'extra'");
  EXPECT_EQ(header_error("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } x"),
            bad + "unexpected text after the dict");
  EXPECT_EQ(header_error("['descr']"), bad + "expected '{'");
  EXPECT_EQ(header_error("{'descr': '<f4' 'shape': (1,)}"), bad + "expected ',' or '}'");
}

TEST(Npy, HeaderErrorsQuoteTheHeaderAndPosition) {
  const std::string dict = "{'descr': '<c12', 'fortran_order': False, 'shape': (1,), }";
  // numpy pads this header with 59 spaces (10 + 58 + 59 + 1 = 128 bytes).
  EXPECT_EQ(error_of(npy(dict, "")),
            "x.npy: bad .npy header: unsupported dtype '<c12' at character 10 of \"" + dict +
                std::string(59, ' ') + "\\n\"");
}

// Types only numpy names: the element's size from the descr, the descr's
// literal text kept for numpy, the bytes as they are (any byte order).
struct Named {
  std::string descr;
  size_t itemsize;
};

TEST(Npy, TypesOnlyNumpyNamesKeepTheirDescrAndBytes) {
  const std::vector<Named> cases{
      {"'<c8'", 8},
      {"'>c16'", 16},
      {"'<c32'", 32},
      {"'<f16'", 16},
      {"'|S5'", 5},
      {"'|a3'", 3},
      {"'<U3'", 12},
      {"'>U1'", 4},
      {"'|V7'", 7},
      {"'<M8[ns]'", 8},
      {"'>m8[10s]'", 8},
      {"'<M8'", 8},
      {"[('a', '<i4'), ('b', '>f8'), ('c', '|S3')]", 15},
      {"[('a', '|i1'), ('', '|V7'), ('b', '<i8')]", 16},
      {"[('p', [('x', '<f4'), ('y', '<f4')]), ('v', '<i2', (3,))]", 14},
      {"[(('the title', 'a'), '<i4'), ('m', '<f8', (2, 3))]", 52},
      {"[(\"it's\", '<i4'), ('b\\'q', '|u1', 2)]", 6},
  };
  for (const Named& c : cases) {
    std::string data;
    for (size_t i = 0; i < 2 * c.itemsize; ++i) data.push_back(static_cast<char>(i * 7 + 1));
    const std::string file =
        npy("{'descr': " + c.descr + ", 'fortran_order': False, 'shape': (2,), }", data);
    const NpyHeader h = parse(file);
    EXPECT_EQ(h.descr, c.descr);
    EXPECT_EQ(h.dtype, DType::kU8);
    EXPECT_EQ(h.itemsize, c.itemsize) << c.descr;
    EXPECT_EQ(h.data_bytes, 2 * c.itemsize);
    std::string out(h.data_bytes, '\0');
    copy_npy(h, reinterpret_cast<const uint8_t*>(file.data()), reinterpret_cast<uint8_t*>(out.data()));
    EXPECT_EQ(out, data) << c.descr;
  }
}

TEST(Npy, FortranOrderOfWideElements) {
  // 2x3 elements of 16 bytes (complex128) stored first axis fastest.
  std::string fortran;
  for (int col = 0; col < 3; ++col) {
    for (int row = 0; row < 2; ++row) fortran += std::string(16, static_cast<char>('a' + row * 3 + col));
  }
  const std::string file =
      npy("{'descr': '<c16', 'fortran_order': True, 'shape': (2, 3), }", fortran);
  const NpyHeader h = parse(file);
  std::string out(h.data_bytes, '\0');
  copy_npy(h, reinterpret_cast<const uint8_t*>(file.data()), reinterpret_cast<uint8_t*>(out.data()));
  std::string c_order;
  for (int i = 0; i < 6; ++i) c_order += std::string(16, static_cast<char>('a' + i));
  EXPECT_EQ(out, c_order);
}

TEST(Npy, ShapeWhoseByteCountOverflowsIsAnError) {
  EXPECT_EQ(error_of(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", "")),
            "x.npy: .npy shape overflows (element count above 2^64)");
  EXPECT_EQ(error_of(npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,), }", "")),
            "x.npy: .npy shape overflows (byte count above 2^64)");
}

}  // namespace
}  // namespace chute

// The .npy format (numpy/lib/format.py): "\x93NUMPY", major and minor version
// bytes, a little-endian header length (2 bytes in 1.0, 4 in 2.0 and 3.0),
// then a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// padded with spaces and ended by '\n', then the raw array bytes.
//
// numpy reads the header with ast.literal_eval; we accept the subset of
// literals that describes a numeric array (quoted keys, a quoted descr,
// True/False, a tuple of non-negative ints) and refuse the rest with a
// reason rather than guess.
#include "decode/npy.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace chute {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

// Header text with a cursor; every failure names `where` and the header.
class HeaderParser {
 public:
  HeaderParser(const char* text, size_t size, const std::string& where)
      : text_(text), size_(size), where_(where) {}

  NpyHeader parse() {
    NpyHeader header{};
    bool have_descr = false, have_order = false, have_shape = false;
    skip_space();
    expect('{');
    skip_space();
    while (peek() != '}') {
      const std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        check_unique(have_descr, key);
        parse_descr(&header);
      } else if (key == "fortran_order") {
        check_unique(have_order, key);
        header.fortran_order = parse_bool();
      } else if (key == "shape") {
        check_unique(have_shape, key);
        header.shape = parse_shape();
      } else {
        fail("unexpected key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail("expected ',' or '}'");
      }
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != size_) fail("unexpected text after the dict");
    if (!have_descr || !have_order || !have_shape) {
      fail("missing key (need 'descr', 'fortran_order' and 'shape')");
    }
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    CHUTE_CHECK(false, kData,
                where_ << ": bad .npy header: " << what << " at character " << pos_ << " of "
                       << printable(text_, size_));
    __builtin_unreachable();  // CHUTE_CHECK(false, ...) always throws
  }

  static std::string printable(const char* text, size_t size) {
    std::string out = "\"";
    for (size_t i = 0; i < size && i < 200; ++i) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      if (c == '\n') {
        out += "\\n";
      } else if (c < 0x20 || c >= 0x7f) {
        out += '?';
      } else {
        out += static_cast<char>(c);
      }
    }
    if (size > 200) out += "...";
    return out + "\"";
  }

  char peek() const { return pos_ < size_ ? text_[pos_] : '\0'; }

  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  void skip_space() {
    while (pos_ < size_ && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                            text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  void check_unique(bool& seen, const std::string& key) {
    if (seen) fail("duplicate key '" + key + "'");
    seen = true;
  }

  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string");
    const size_t begin = ++pos_;
    while (pos_ < size_ && text_[pos_] != quote) {
      // Escapes never occur in numeric descrs or in the three keys.
      if (text_[pos_] == '\\' || text_[pos_] == '\n') fail("unsupported character in a string");
      ++pos_;
    }
    if (pos_ >= size_) fail("unterminated string");
    std::string s(text_ + begin, pos_ - begin);
    ++pos_;
    return s;
  }

  void parse_descr(NpyHeader* header) {
    if (peek() == '[') fail("structured dtypes (a list descr) are not supported");
    const size_t at = pos_;
    const std::string descr = parse_string();
    if (dtype_from_numpy_descr(descr, &header->dtype, &header->byteswap)) return;
    pos_ = at;
    const char kind = descr.size() >= 2 && (descr[0] == '<' || descr[0] == '>' ||
                                            descr[0] == '|' || descr[0] == '=')
                          ? descr[1]
                          : (descr.empty() ? '\0' : descr[0]);
    if (kind == 'O') fail("object arrays ('" + descr + "', pickled Python objects) are refused");
    if (kind == 'U' || kind == 'S' || kind == 'a') {
      fail("string dtype '" + descr + "' is not supported (numeric dtypes only)");
    }
    if (kind == 'V') fail("void/structured dtype '" + descr + "' is not supported");
    fail("unsupported dtype '" + descr + "'");
  }

  bool parse_bool() {
    if (size_ - pos_ >= 4 && std::memcmp(text_ + pos_, "True", 4) == 0) {
      pos_ += 4;
      return true;
    }
    if (size_ - pos_ >= 5 && std::memcmp(text_ + pos_, "False", 5) == 0) {
      pos_ += 5;
      return false;
    }
    fail("fortran_order must be True or False");
  }

  // A tuple: "()", "(n,)", "(n, m)", "(n, m,)". "(n)" is an int in Python,
  // which numpy refuses as a shape, and so do we.
  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    expect('(');
    skip_space();
    bool trailing_comma = false;
    while (peek() != ')') {
      if (peek() < '0' || peek() > '9') fail("shape entries must be non-negative integers");
      uint64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        const uint64_t digit = static_cast<uint64_t>(peek() - '0');
        if (v > (static_cast<uint64_t>(INT64_MAX) - digit) / 10) fail("shape entry overflows");
        v = v * 10 + digit;
        ++pos_;
      }
      shape.push_back(static_cast<int64_t>(v));
      skip_space();
      trailing_comma = false;
      if (peek() == ',') {
        ++pos_;
        trailing_comma = true;
        skip_space();
      } else if (peek() != ')') {
        fail("expected ',' or ')' in shape");
      }
    }
    if (shape.size() == 1 && !trailing_comma) fail("shape must be a tuple: '(n,)', not '(n)'");
    ++pos_;  // ')'
    return shape;
  }

  const char* text_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& where_;
};

uint32_t read_le(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline void copy_element(const uint8_t* src, uint8_t* dst, size_t itemsize, bool swap) {
  if (!swap) {
    std::memcpy(dst, src, itemsize);
  } else {
    for (size_t b = 0; b < itemsize; ++b) dst[b] = src[itemsize - 1 - b];
  }
}

}  // namespace

NpyHeader parse_npy_header(const uint8_t* data, size_t size, const std::string& where) {
  CHUTE_CHECK(size >= kMagicSize + 2 && std::memcmp(data, kMagic, kMagicSize) == 0, kData,
              where << ": not a .npy file (no \\x93NUMPY magic)");
  const int major = data[6];
  const int minor = data[7];
  CHUTE_CHECK(minor == 0 && (major == 1 || major == 2 || major == 3), kData,
              where << ": unsupported .npy format version " << major << "." << minor);
  // 1.0: 2-byte header length; 2.0 widened it to 4; 3.0 only allows UTF-8
  // text in it, which a numeric header never uses.
  const int len_bytes = major == 1 ? 2 : 4;
  const size_t prefix = kMagicSize + 2 + len_bytes;
  CHUTE_CHECK(size >= prefix, kData, where << ": truncated .npy header (" << size << " bytes)");
  const size_t header_len = read_le(data + kMagicSize + 2, len_bytes);
  CHUTE_CHECK(header_len <= size - prefix, kData,
              where << ": truncated .npy header: it declares " << header_len
                    << " bytes, the file has " << size - prefix << " after the prefix");
  HeaderParser parser(reinterpret_cast<const char*>(data + prefix), header_len, where);
  NpyHeader header = parser.parse();
  header.data_offset = prefix + header_len;

  uint64_t count = 1;
  for (int64_t d : header.shape) {
    CHUTE_CHECK(!__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count), kData,
                where << ": .npy shape overflows (element count above 2^64)");
  }
  uint64_t bytes = 0;
  CHUTE_CHECK(!__builtin_mul_overflow(count, static_cast<uint64_t>(dtype_size(header.dtype)),
                                      &bytes),
              kData, where << ": .npy shape overflows (byte count above 2^64)");
  CHUTE_CHECK(bytes <= size - header.data_offset, kData,
              where << ": truncated .npy payload: the header promises " << bytes
                    << " bytes of " << dtype_name(header.dtype) << ", the file has "
                    << size - header.data_offset);
  header.data_bytes = static_cast<size_t>(bytes);
  return header;
}

void copy_npy(const NpyHeader& header, const uint8_t* data, uint8_t* out) {
  copy_npy_array(header.dtype, header.byteswap, header.fortran_order, header.shape,
                 data + header.data_offset, out);
}

void copy_npy_array(DType dtype, bool byteswap, bool fortran_order,
                    const std::vector<int64_t>& shape, const uint8_t* src, uint8_t* out) {
  const size_t itemsize = dtype_size(dtype);
  size_t count = 1;
  for (int64_t d : shape) count *= static_cast<size_t>(d);
  if (count == 0 || itemsize == 0) return;
  const bool swap = byteswap && itemsize > 1;

  // Fortran and C order are the same bytes when at most one axis is longer than 1.
  int long_axes = 0;
  for (int64_t d : shape) long_axes += d > 1;
  if (!fortran_order || long_axes <= 1) {
    if (!swap) {
      std::memcpy(out, src, count * itemsize);
    } else {
      for (size_t i = 0; i < count; ++i) {
        copy_element(src + i * itemsize, out + i * itemsize, itemsize, swap);
      }
    }
    return;
  }

  // Fortran -> C for any ndim: walk the output in C order with an odometer
  // over the index, tracking the source offset (axis k's Fortran stride is
  // the product of the axes before it).
  const size_t ndim = shape.size();
  std::vector<size_t> stride(ndim);
  size_t s = itemsize;
  for (size_t k = 0; k < ndim; ++k) {
    stride[k] = s;
    s *= static_cast<size_t>(shape[k]);
  }
  std::vector<int64_t> index(ndim, 0);
  const size_t last = ndim - 1;
  const int64_t inner = shape[last];
  const size_t inner_stride = stride[last];
  size_t offset = 0;  // source offset of index[0..last-1] with index[last] = 0
  for (size_t done = 0; done < count; done += static_cast<size_t>(inner)) {
    const uint8_t* p = src + offset;
    for (int64_t i = 0; i < inner; ++i) {
      copy_element(p + i * inner_stride, out, itemsize, swap);
      out += itemsize;
    }
    for (size_t k = last; k-- > 0;) {
      if (++index[k] < shape[k]) {
        offset += stride[k];
        break;
      }
      offset -= stride[k] * static_cast<size_t>(index[k] - 1);
      index[k] = 0;
    }
  }
}

}  // namespace chute

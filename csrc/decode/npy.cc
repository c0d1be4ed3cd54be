// The .npy format (numpy/lib/format.py): "\x93NUMPY", major and minor version
// bytes, a little-endian header length (2 bytes in 1.0, 4 in 2.0 and 3.0),
// then a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// padded with spaces and ended by '\n', then the raw array bytes.
//
// numpy reads the header with ast.literal_eval; we accept the literals that
// describe an array (quoted keys, a descr as numpy writes one: a type string
// or a list of fields, True/False, a tuple of non-negative ints) and refuse
// the rest with a reason rather than guess.
#include "decode/npy.h"

#include <cstring>
#include <initializer_list>
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
                At{where_} << "bad .npy header: " << what << " at character " << pos_ << " of "
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

  // The descr: a type string, or a list of fields for a structured dtype.
  // A DType is read as such; any other fixed-size type keeps its literal
  // text for numpy, and only its size matters here.
  void parse_descr(NpyHeader* header) {
    const size_t begin = pos_;
    header->byteswap = false;
    if (peek() == '[') {
      header->itemsize = parse_fields(0);
    } else {
      const size_t at = pos_;
      const std::string type = parse_string();
      if (dtype_from_numpy_descr(type, &header->dtype, &header->byteswap)) {
        header->itemsize = dtype_size(header->dtype);
        header->descr.clear();
        return;
      }
      header->itemsize = type_size(type, at);
    }
    if (header->itemsize == 0) {
      pos_ = begin;
      fail("zero-size dtype");
    }
    header->dtype = DType::kU8;
    header->descr.assign(text_ + begin, pos_ - begin);
  }

  // Size of one element of a type string such as '<c8', '|S10', '<U3',
  // '|V16', '<M8[ns]', '>m8[10s]' (numpy's dtype.str).
  size_t type_size(const std::string& type, size_t at) {
    size_t i = type.empty() || std::strchr("<>|=", type[0]) == nullptr ? 0 : 1;
    const char kind = i < type.size() ? type[i] : '\0';
    ++i;
    auto refuse = [&](const std::string& why) {
      pos_ = at;
      fail(why);
    };
    if (kind == 'O') {
      refuse("object arrays ('" + type +
             "', pickled Python objects) cannot be loaded without pickle, as "
             "np.load(allow_pickle=False) refuses them");
    }
    uint64_t n = 0;
    const size_t digits = i;
    while (i < type.size() && type[i] >= '0' && type[i] <= '9' && n < (uint64_t{1} << 40)) {
      n = n * 10 + static_cast<uint64_t>(type[i++] - '0');
    }
    const bool sized = i > digits;
    std::string rest = type.substr(i);
    auto one_of = [&](std::initializer_list<uint64_t> sizes) {
      for (uint64_t v : sizes) {
        if (n == v) return true;
      }
      return false;
    };
    bool ok = sized && rest.empty();
    switch (kind) {
      case 'c':
        ok = ok && one_of({8, 16, 32});
        break;
      case 'f':
        ok = ok && one_of({2, 4, 8, 16});
        break;
      case 'i':
      case 'u':
        ok = ok && one_of({1, 2, 4, 8});
        break;
      case 'b':
        ok = ok && n == 1;
        break;
      case 'S':
      case 'a':
      case 'V':
        break;
      case 'U':
        n *= 4;  // UCS-4
        break;
      case 'M':
      case 'm':
        ok = sized && n == 8 && (rest.empty() || datetime_unit(rest));
        break;
      default:
        ok = false;
    }
    if (!ok) refuse("unsupported dtype '" + type + "'");
    return static_cast<size_t>(n);
  }

  // "[unit]" or "[Nunit]" of a datetime64/timedelta64 type.
  static bool datetime_unit(const std::string& s) {
    if (s.size() < 3 || s.front() != '[' || s.back() != ']') return false;
    size_t i = 1;
    while (i + 1 < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    const std::string unit = s.substr(i, s.size() - 1 - i);
    for (const char* u : {"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "\xce\xbcs", "ns", "ps",
                          "fs", "as", "generic"}) {
      if (unit == u) return true;
    }
    return false;
  }

  // A structured descr: [(name, type[, shape]), ...], name a string or a
  // (title, name) pair, type a string or a nested list; returns the record's
  // size. numpy writes padding as fields named '' of type '|Vn', so the
  // fields' sizes add up to the record's.
  size_t parse_fields(int depth) {
    if (depth > 32) fail("structured dtype nested too deeply");
    expect('[');
    skip_space();
    uint64_t total = 0;
    while (peek() != ']') {
      expect('(');
      skip_space();
      if (peek() == '(') {  // (title, name)
        ++pos_;
        skip_space();
        skip_string();
        skip_space();
        expect(',');
        skip_space();
        skip_string();
        skip_space();
        expect(')');
      } else {
        skip_string();
      }
      skip_space();
      expect(',');
      skip_space();
      uint64_t size = 0;
      if (peek() == '[') {
        size = parse_fields(depth + 1);
      } else {
        const size_t at = pos_;
        const std::string type = parse_string();
        DType t;
        bool swap;
        size = dtype_from_numpy_descr(type, &t, &swap) ? dtype_size(t) : type_size(type, at);
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
        if (peek() != ')') {
          size = checked_product(size, parse_subarray_count());
          skip_space();
          if (peek() == ',') {
            ++pos_;
            skip_space();
          }
        }
      }
      expect(')');
      if (__builtin_add_overflow(total, size, &total)) fail("structured dtype too large");
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != ']') {
        fail("expected ',' or ']' in a structured descr");
      }
    }
    ++pos_;  // ']'
    if (total > (uint64_t{1} << 40)) fail("structured dtype too large");
    return static_cast<size_t>(total);
  }

  // A field's subarray shape: an int or a tuple of ints; their product.
  uint64_t parse_subarray_count() {
    if (peek() != '(') return parse_uint();
    ++pos_;
    skip_space();
    uint64_t count = 1;
    while (peek() != ')') {
      count = checked_product(count, parse_uint());
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != ')') {
        fail("expected ',' or ')' in a field's shape");
      }
    }
    ++pos_;
    return count;
  }

  uint64_t parse_uint() {
    if (peek() < '0' || peek() > '9') fail("expected a non-negative integer");
    uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      if (v > (uint64_t{1} << 40)) fail("number too large");
      v = v * 10 + static_cast<uint64_t>(peek() - '0');
      ++pos_;
    }
    return v;
  }

  uint64_t checked_product(uint64_t a, uint64_t b) {
    uint64_t out;
    if (__builtin_mul_overflow(a, b, &out) || out > (uint64_t{1} << 40)) {
      fail("structured dtype too large");
    }
    return out;
  }

  // Moves past a quoted string, escapes included (field names are Python
  // literals; numpy reads them, we only need where they end).
  void skip_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string");
    ++pos_;
    while (pos_ < size_ && text_[pos_] != quote) {
      if (text_[pos_] == '\\') ++pos_;
      ++pos_;
    }
    if (pos_ >= size_) fail("unterminated string");
    ++pos_;
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
              At{where} << "not a .npy file (no \\x93NUMPY magic)");
  const int major = data[6];
  const int minor = data[7];
  CHUTE_CHECK(minor == 0 && (major == 1 || major == 2 || major == 3), kData,
              At{where} << "unsupported .npy format version " << major << "." << minor);
  // 1.0: 2-byte header length; 2.0 widened it to 4; 3.0 only allows UTF-8
  // text in it, which a numeric header never uses.
  const int len_bytes = major == 1 ? 2 : 4;
  const size_t prefix = kMagicSize + 2 + len_bytes;
  CHUTE_CHECK(size >= prefix, kData, At{where} << "truncated .npy header (" << size << " bytes)");
  const size_t header_len = read_le(data + kMagicSize + 2, len_bytes);
  CHUTE_CHECK(header_len <= size - prefix, kData,
              At{where} << "truncated .npy header: it declares " << header_len
                    << " bytes, the file has " << size - prefix << " after the prefix");
  HeaderParser parser(reinterpret_cast<const char*>(data + prefix), header_len, where);
  NpyHeader header = parser.parse();
  header.data_offset = prefix + header_len;

  uint64_t count = 1;
  for (int64_t d : header.shape) {
    CHUTE_CHECK(!__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count), kData,
                At{where} << ".npy shape overflows (element count above 2^64)");
  }
  uint64_t bytes = 0;
  CHUTE_CHECK(!__builtin_mul_overflow(count, static_cast<uint64_t>(header.itemsize), &bytes),
              kData, At{where} << ".npy shape overflows (byte count above 2^64)");
  CHUTE_CHECK(bytes <= size - header.data_offset, kData,
              At{where} << "truncated .npy payload: the header promises " << bytes << " bytes of "
                    << (header.descr.empty() ? dtype_name(header.dtype) : header.descr)
                    << ", the file has " << size - header.data_offset);
  header.data_bytes = static_cast<size_t>(bytes);
  return header;
}

void copy_npy(const NpyHeader& header, const uint8_t* data, uint8_t* out) {
  copy_npy_array(header.itemsize, header.byteswap, header.fortran_order, header.shape,
                 data + header.data_offset, out);
}

void copy_npy_array(size_t itemsize, bool byteswap, bool fortran_order,
                    const std::vector<int64_t>& shape, const uint8_t* src, uint8_t* out) {
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

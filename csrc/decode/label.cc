#include "decode/label.h"

#include <cstdio>

#include "core/error.h"

namespace chute {
namespace {

// bytes.strip()'s set, which is also what int() skips around a number
// (Py_ISSPACE: the ASCII whitespace characters).
bool is_space(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

// The label as Python would print it in an error (b'...'), cut short.
std::string quoted(const uint8_t* data, size_t size) {
  std::string out = "b'";
  char buf[8];
  for (size_t i = 0; i < size && i < 40; ++i) {
    const uint8_t c = data[i];
    if (c == '\\' || c == '\'') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (size > 40) out += "...";
  return out + "'";
}

}  // namespace

int64_t parse_int_label(const uint8_t* data, size_t size, const std::string& where) {
  size_t begin = 0, end = size;
  while (begin < end && is_space(data[begin])) ++begin;
  while (end > begin && is_space(data[end - 1])) --end;
  size_t i = begin;
  bool negative = false;
  if (i < end && (data[i] == '+' || data[i] == '-')) negative = data[i++] == '-';
  // Python: digits, with single underscores allowed only between two digits.
  bool ok = i < end && is_digit(data[i]);
  bool overflow = false;
  uint64_t magnitude = 0;
  // |INT64_MIN| = 2^63 is representable only for negative labels.
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  for (; ok && i < end; ++i) {
    const uint8_t c = data[i];
    if (c == '_') {
      ok = i + 1 < end && is_digit(data[i + 1]);  // the previous byte was a digit
      continue;
    }
    if (!is_digit(c)) {
      ok = false;
      break;
    }
    const uint64_t digit = c - '0';
    if (magnitude > (limit - digit) / 10) overflow = true;
    if (!overflow) magnitude = magnitude * 10 + digit;
  }
  CHUTE_CHECK(ok, kData,
              At{where} << "invalid integer label " << quoted(data, size)
                    << " (expected decimal digits, as Python's int() reads them)");
  CHUTE_CHECK(!overflow, kData,
              At{where} << "integer label " << quoted(data, size) << " does not fit in int64");
  return negative ? static_cast<int64_t>(~magnitude + 1) : static_cast<int64_t>(magnitude);
}

}  // namespace chute

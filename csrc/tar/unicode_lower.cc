#include "tar/unicode_lower.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tar/unicode_lower_tables.h"

namespace chute {
namespace {

// A decoded unit: a code point, or (escape) one byte that is not valid UTF-8.
struct Unit {
  uint32_t value;
  bool escape;
};

// Decodes as Python's strict UTF-8 codec does: no overlong forms, no
// surrogates, nothing above U+10FFFF. Whatever fails becomes byte escapes.
std::vector<Unit> decode(const std::string& s) {
  std::vector<Unit> out;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    size_t len = 0;
    uint32_t cp = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (b < 0x80) {
      out.push_back({b, false});
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
      cp = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      cp = b & 0x0F;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      cp = b & 0x07;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    }
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char c = p[i + k];
      ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      cp = (cp << 6) | (c & 0x3F);
    }
    if (!ok) {
      out.push_back({b, true});
      ++i;
      continue;
    }
    out.push_back({cp, false});
    i += len;
  }
  return out;
}

void encode(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

template <size_t N>
bool in_spans(const unicode_lower::Span (&spans)[N], uint32_t cp) {
  const auto* it = std::upper_bound(std::begin(spans), std::end(spans), cp,
                                    [](uint32_t v, const unicode_lower::Span& s) { return v < s.first; });
  return it != std::begin(spans) && cp <= (it - 1)->last;
}

uint32_t lower_one(uint32_t cp) {
  const auto* it = std::upper_bound(
      std::begin(unicode_lower::kMappings), std::end(unicode_lower::kMappings), cp,
      [](uint32_t v, const unicode_lower::Mapping& m) { return v < m.first; });
  if (it == std::begin(unicode_lower::kMappings)) return cp;
  const unicode_lower::Mapping& m = *(it - 1);
  if (cp > m.last || (cp - m.first) % m.stride != 0) return cp;
  return static_cast<uint32_t>(static_cast<int64_t>(cp) + m.delta);
}

bool case_ignorable(const Unit& u) { return !u.escape && in_spans(unicode_lower::kCaseIgnorable, u.value); }
bool cased(const Unit& u) { return !u.escape && in_spans(unicode_lower::kCased, u.value); }

// Python's handle_capital_sigma: final when a cased letter comes before
// (across case-ignorable ones) and none comes after.
bool final_sigma(const std::vector<Unit>& units, size_t i) {
  size_t j = i;
  while (j > 0 && case_ignorable(units[j - 1])) --j;
  if (j == 0 || !cased(units[j - 1])) return false;
  size_t k = i + 1;
  while (k < units.size() && case_ignorable(units[k])) ++k;
  return k == units.size() || !cased(units[k]);
}

constexpr uint32_t kCapitalSigma = 0x3A3;
constexpr uint32_t kDottedCapitalI = 0x130;

}  // namespace

std::string lower_like_python(const std::string& bytes) {
  // The common case, all ASCII, needs no decoding.
  if (std::all_of(bytes.begin(), bytes.end(), [](char c) { return (c & 0x80) == 0; })) {
    std::string out = bytes;
    for (char& c : out) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return out;
  }
  const std::vector<Unit> units = decode(bytes);
  std::string out;
  out.reserve(bytes.size() + 4);
  for (size_t i = 0; i < units.size(); ++i) {
    const Unit& u = units[i];
    if (u.escape) {
      out.push_back(static_cast<char>(u.value));
    } else if (u.value == kCapitalSigma) {
      encode(final_sigma(units, i) ? 0x3C2 : 0x3C3, out);
    } else if (u.value == kDottedCapitalI) {
      encode('i', out);
      encode(0x307, out);
    } else {
      encode(lower_one(u.value), out);
    }
  }
  return out;
}

}  // namespace chute

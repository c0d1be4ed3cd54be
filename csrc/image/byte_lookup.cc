#include "image/byte_lookup.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CHUTE_BYTE_LOOKUP_VBMI 1
#endif

namespace chute {

ByteToU16Table::ByteToU16Table(const std::array<uint16_t, 256>& values) : values_(values) {
  for (int v = 0; v < 256; ++v) {
    low_[v] = static_cast<uint8_t>(values[v] & 0xff);
    high_[v] = static_cast<uint8_t>(values[v] >> 8);
  }
}

namespace {

void map_scalar(const ByteToU16Table& table, const uint8_t* in, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = table[in[i]];
}

#ifdef CHUTE_BYTE_LOOKUP_VBMI

#define CHUTE_VBMI_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi")))

// One byte of each value for 64 indices: a two-table permute reads entries
// by the index's low 7 bits, one for entries 0-127 and one for 128-255; the
// index's top bit picks between them.
CHUTE_VBMI_TARGET inline __m512i lookup_bytes(__m512i index, __mmask64 upper, const __m512i* t) {
  const __m512i below = _mm512_permutex2var_epi8(t[0], index, t[1]);
  const __m512i above = _mm512_permutex2var_epi8(t[2], index, t[3]);
  return _mm512_mask_blend_epi8(upper, below, above);
}

CHUTE_VBMI_TARGET void map_vbmi(const uint8_t* low, const uint8_t* high, const uint8_t* in,
                                size_t n, uint16_t* out) {
  __m512i lo_t[4], hi_t[4];
  for (int k = 0; k < 4; ++k) {
    lo_t[k] = _mm512_loadu_si512(low + 64 * k);
    hi_t[k] = _mm512_loadu_si512(high + 64 * k);
  }
  // Interleaving the low and high bytes back into 16-bit values: entry j of
  // the first result is byte j/2 of `low` (even j) or of `high` (odd j).
  alignas(64) uint8_t order[2][64];
  for (int j = 0; j < 64; ++j) {
    order[0][j] = static_cast<uint8_t>((j & 1 ? 64 : 0) + j / 2);
    order[1][j] = static_cast<uint8_t>((j & 1 ? 64 : 0) + 32 + j / 2);
  }
  const __m512i first_half = _mm512_load_si512(order[0]);
  const __m512i second_half = _mm512_load_si512(order[1]);
  for (size_t i = 0; i < n; i += 64) {
    const size_t left = n - i;
    const __mmask64 take = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
    const __m512i index = _mm512_maskz_loadu_epi8(take, in + i);
    const __mmask64 upper = _mm512_movepi8_mask(index);
    const __m512i lo = lookup_bytes(index, upper, lo_t);
    const __m512i hi = lookup_bytes(index, upper, hi_t);
    const __m512i values0 = _mm512_permutex2var_epi8(lo, first_half, hi);
    const __m512i values1 = _mm512_permutex2var_epi8(lo, second_half, hi);
    const __mmask32 take0 = left >= 32 ? ~__mmask32{0} : (__mmask32{1} << left) - 1;
    const __mmask32 take1 =
        left >= 64 ? ~__mmask32{0} : (left <= 32 ? 0 : (__mmask32{1} << (left - 32)) - 1);
    _mm512_mask_storeu_epi16(out + i, take0, values0);
    _mm512_mask_storeu_epi16(out + i + 32, take1, values1);
  }
}

bool have_vbmi() {
  static const bool have = __builtin_cpu_supports("avx512f") &&
                           __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vbmi");
  return have;
}

#endif

}  // namespace

bool ByteToU16Table::vectorized() {
#ifdef CHUTE_BYTE_LOOKUP_VBMI
  return have_vbmi();
#else
  return false;
#endif
}

void ByteToU16Table::map(const uint8_t* in, size_t n, uint16_t* out) const {
#ifdef CHUTE_BYTE_LOOKUP_VBMI
  if (have_vbmi()) {
    map_vbmi(low_.data(), high_.data(), in, n, out);
    return;
  }
#endif
  map_scalar(*this, in, n, out);
}

}  // namespace chute

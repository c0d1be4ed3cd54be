#include "image/byte_lookup.h"

#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CHUTE_BYTE_LOOKUP_VBMI 1
#endif

namespace chute {

template <typename T>
ByteTable<T>::ByteTable(const std::array<T, 256>& values) : values_(values) {
  for (int v = 0; v < 256; ++v) {
    uint8_t bytes[sizeof(T)];
    std::memcpy(bytes, &values[v], sizeof(T));
    for (size_t k = 0; k < sizeof(T); ++k) bytes_[k][v] = bytes[k];
  }
}

namespace {

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

// Selectors that interleave two vectors of bytes (or of 16-bit words):
// entry j of the result is element j/2 of the first vector's `half` (lower
// or upper) for even j, of the second's for odd j.
CHUTE_VBMI_TARGET inline __m512i interleave_bytes(int half) {
  alignas(64) uint8_t order[64];
  for (int j = 0; j < 64; ++j) {
    order[j] = static_cast<uint8_t>((j & 1 ? 64 : 0) + 32 * half + j / 2);
  }
  return _mm512_load_si512(order);
}
CHUTE_VBMI_TARGET inline __m512i interleave_words(int half) {
  alignas(64) uint16_t order[32];
  for (int j = 0; j < 32; ++j) {
    order[j] = static_cast<uint16_t>((j & 1 ? 32 : 0) + 16 * half + j / 2);
  }
  return _mm512_load_si512(order);
}

// Values written by the store that takes positions [first, first + width)
// of a block with `left` values still to write.
inline uint64_t store_mask(size_t left, size_t first, size_t width) {
  if (left <= first) return 0;
  const size_t count = left - first < width ? left - first : width;
  return count == 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1;
}

template <size_t kBytes>
CHUTE_VBMI_TARGET void map_vbmi(const std::array<std::array<uint8_t, 256>, kBytes>& bytes,
                                const uint8_t* in, size_t n, void* out) {
  __m512i tables[kBytes][4];
  for (size_t k = 0; k < kBytes; ++k) {
    for (int q = 0; q < 4; ++q) tables[k][q] = _mm512_loadu_si512(bytes[k].data() + 64 * q);
  }
  const __m512i byte_order[2] = {interleave_bytes(0), interleave_bytes(1)};
  const __m512i word_order[2] = {interleave_words(0), interleave_words(1)};
  auto* dst = static_cast<uint8_t*>(out);
  for (size_t i = 0; i < n; i += 64) {
    const size_t left = n - i;
    const __m512i index = _mm512_maskz_loadu_epi8(store_mask(left, 0, 64), in + i);
    const __mmask64 upper = _mm512_movepi8_mask(index);
    __m512i b[kBytes];
    for (size_t k = 0; k < kBytes; ++k) b[k] = lookup_bytes(index, upper, tables[k]);
    // Bytes 0 and 1 of values 0-31 and 32-63 as 16-bit words.
    __m512i low[2];
    for (int h = 0; h < 2; ++h) low[h] = _mm512_permutex2var_epi8(b[0], byte_order[h], b[1]);
    uint8_t* block = dst + i * kBytes;
    if constexpr (kBytes == 2) {
      for (int h = 0; h < 2; ++h) {
        _mm512_mask_storeu_epi16(block + 64 * h,
                                 static_cast<__mmask32>(store_mask(left, 32 * h, 32)), low[h]);
      }
    } else {
      __m512i high[2];
      for (int h = 0; h < 2; ++h) high[h] = _mm512_permutex2var_epi8(b[2], byte_order[h], b[3]);
      // Words to 32-bit values: 16 values per store.
      for (int q = 0; q < 4; ++q) {
        const __m512i value =
            _mm512_permutex2var_epi16(low[q / 2], word_order[q % 2], high[q / 2]);
        _mm512_mask_storeu_epi32(block + 64 * q,
                                 static_cast<__mmask16>(store_mask(left, 16 * q, 16)), value);
      }
    }
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

template <typename T>
bool ByteTable<T>::vectorized() {
#ifdef CHUTE_BYTE_LOOKUP_VBMI
  return have_vbmi();
#else
  return false;
#endif
}

template <typename T>
void ByteTable<T>::map(const uint8_t* in, size_t n, T* out) const {
#ifdef CHUTE_BYTE_LOOKUP_VBMI
  if (have_vbmi()) {
    map_vbmi<sizeof(T)>(bytes_, in, n, out);
    return;
  }
#endif
  for (size_t i = 0; i < n; ++i) out[i] = values_[in[i]];
}

template class ByteTable<uint16_t>;
template class ByteTable<float>;

}  // namespace chute

#include "image/split_rgb.h"

#include <array>
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace chute {
namespace {

// Written per byte, the split is slow because compilers do not vectorize a
// stride-3 gather well; with SSSE3 shuffles it is 16 pixels per 3 loads and
// 3 stores.
void split_rgb_scalar(const uint8_t* __restrict src, size_t n, uint8_t* __restrict r,
                      uint8_t* __restrict g, uint8_t* __restrict b) {
  for (size_t i = 0; i < n; ++i, src += 3) {
    r[i] = src[0];
    g[i] = src[1];
    b[i] = src[2];
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CHUTE_HAVE_SSSE3_SPLIT 1

// The pshufb control that moves channel `ch` of the 16 pixels in 48 bytes into
// lanes 0..15, taking the bytes that lie in 16-byte vector `v`; 0x80 zeroes
// a lane (filled from one of the other two vectors, then OR-ed together).
constexpr std::array<int8_t, 16> split_mask(int ch, int v) {
  std::array<int8_t, 16> m{};
  for (int i = 0; i < 16; ++i) {
    const int idx = 3 * i + ch;
    m[static_cast<size_t>(i)] = static_cast<int8_t>(idx / 16 == v ? idx % 16 : 0x80);
  }
  return m;
}

// The baseline x86-64 target has no SSSE3; this one function is compiled for
// it and chosen at run time.
__attribute__((target("ssse3"))) void split_rgb_ssse3(const uint8_t* __restrict src, size_t n,
                                                      uint8_t* __restrict r,
                                                      uint8_t* __restrict g,
                                                      uint8_t* __restrict b) {
  static constexpr std::array<int8_t, 16> kMasks[3][3] = {
      {split_mask(0, 0), split_mask(0, 1), split_mask(0, 2)},
      {split_mask(1, 0), split_mask(1, 1), split_mask(1, 2)},
      {split_mask(2, 0), split_mask(2, 1), split_mask(2, 2)}};
  __m128i masks[3][3];
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 3; ++v) {
      masks[c][v] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMasks[c][v].data()));
    }
  }
  uint8_t* planes[3] = {r, g, b};
  size_t i = 0;
  for (; i + 16 <= n; i += 16, src += 48) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i bb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i cc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    for (int c = 0; c < 3; ++c) {
      const __m128i v = _mm_or_si128(
          _mm_or_si128(_mm_shuffle_epi8(a, masks[c][0]), _mm_shuffle_epi8(bb, masks[c][1])),
          _mm_shuffle_epi8(cc, masks[c][2]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(planes[c] + i), v);
    }
  }
  split_rgb_scalar(src, n - i, r + i, g + i, b + i);
}

// 16 bytes from `lo` in the low lane, 16 from `hi` in the high one.
__attribute__((target("avx2"))) inline __m256i load_lanes(const uint8_t* lo, const uint8_t* hi) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
}

// The same shuffles on 32 pixels at once: each 128-bit lane takes its own 16
// pixels (48 bytes), so no shuffle crosses lanes. Half the instructions per
// pixel of the SSSE3 loop.
__attribute__((target("avx2"))) void split_rgb_avx2(const uint8_t* __restrict src, size_t n,
                                                    uint8_t* __restrict r, uint8_t* __restrict g,
                                                    uint8_t* __restrict b) {
  __m256i masks[3][3];
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 3; ++v) {
      const std::array<int8_t, 16> m = split_mask(c, v);
      masks[c][v] =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m.data())));
    }
  }
  uint8_t* planes[3] = {r, g, b};
  size_t i = 0;
  for (; i + 32 <= n; i += 32, src += 96) {
    const __m256i a = load_lanes(src, src + 48);
    const __m256i bb = load_lanes(src + 16, src + 64);
    const __m256i cc = load_lanes(src + 32, src + 80);
    for (int c = 0; c < 3; ++c) {
      const __m256i v = _mm256_or_si256(
          _mm256_or_si256(_mm256_shuffle_epi8(a, masks[c][0]), _mm256_shuffle_epi8(bb, masks[c][1])),
          _mm256_shuffle_epi8(cc, masks[c][2]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(planes[c] + i), v);
    }
  }
  split_rgb_ssse3(src, n - i, r + i, g + i, b + i);
}
#endif

using SplitRgb = void (*)(const uint8_t*, size_t, uint8_t*, uint8_t*, uint8_t*);

SplitRgb pick_split_rgb() {
#ifdef CHUTE_HAVE_SSSE3_SPLIT
  if (__builtin_cpu_supports("avx2")) return split_rgb_avx2;
  if (__builtin_cpu_supports("ssse3")) return split_rgb_ssse3;
#endif
  return split_rgb_scalar;
}

}  // namespace

void split_rgb(const uint8_t* src, size_t n, uint8_t* r, uint8_t* g, uint8_t* b) {
  static const SplitRgb impl = pick_split_rgb();
  impl(src, n, r, g, b);
}

}  // namespace chute

#include "image/resample_kernels.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CHUTE_RESAMPLE_X86 1
#endif

#include "core/error.h"

namespace chute {
namespace {

inline uint8_t clamp8(int32_t v) { return static_cast<uint8_t>(std::clamp(v, 0, 255)); }

// The taps as plain pointers held in locals: the kernels store bytes, which
// may alias anything, so members read through `const AxisTaps&` would be
// reloaded after every store.
struct Taps {
  const int32_t* start;
  const int32_t* count;
  const int16_t* weights;
  size_t stride;
  int precision;
  int out_size;
  explicit Taps(const AxisTaps& t)
      : start(t.start.data()),
        count(t.count.data()),
        weights(t.weights.data()),
        stride(static_cast<size_t>(t.stride)),
        precision(t.precision),
        out_size(t.out_size) {}
  const int16_t* weights_of(int o) const { return weights + static_cast<size_t>(o) * stride; }
};

// A copy axis (one tap of weight 1 per pixel, consecutive sources).
template <int C>
void copy_row(const uint8_t* src, int origin, const AxisTaps& t, bool flip, uint8_t* dst) {
  const uint8_t* p = src + static_cast<size_t>(t.start[0] - origin) * C;
  const int n = t.out_size;
  if (!flip) {
    std::memcpy(dst, p, static_cast<size_t>(n) * C);
    return;
  }
  for (int d = 0; d < n; ++d) {
    const uint8_t* s = p + static_cast<size_t>(n - 1 - d) * C;
    for (int c = 0; c < C; ++c) dst[d * C + c] = s[c];
  }
}

template <int C>
inline void pixel_scalar(const uint8_t* src, int origin, const Taps& t, int o, uint8_t* out) {
  const uint8_t* p = src + static_cast<size_t>(t.start[o] - origin) * C;
  const int16_t* w = t.weights_of(o);
  const int n = t.count[o];
  int32_t acc[C];
  for (int c = 0; c < C; ++c) acc[c] = int32_t{1} << (t.precision - 1);
  for (int k = 0; k < n; ++k, p += C) {
    for (int c = 0; c < C; ++c) acc[c] += w[k] * p[c];
  }
  for (int c = 0; c < C; ++c) out[c] = clamp8(acc[c] >> t.precision);
}

template <int C>
void horizontal_scalar(const uint8_t* src, int origin, int /*available*/, const AxisTaps& taps,
                       bool flip, uint8_t* dst) {
  if (taps.copy) {
    copy_row<C>(src, origin, taps, flip, dst);
    return;
  }
  const Taps t(taps);
  const int n = t.out_size;
  for (int d = 0; d < n; ++d) pixel_scalar<C>(src, origin, t, flip ? n - 1 - d : d, dst + d * C);
}

// Bytes [first, bytes): the whole row, or the tail a vector loop left.
void vertical_tail(const uint8_t* const* rows, const int16_t* w, int count, int precision,
                   size_t first, size_t bytes, uint8_t* dst) {
  const int32_t round = int32_t{1} << (precision - 1);
  for (size_t i = first; i < bytes; ++i) {
    int32_t acc = round;
    for (int k = 0; k < count; ++k) acc += w[k] * rows[k][i];
    dst[i] = clamp8(acc >> precision);
  }
}

void vertical_scalar(const uint8_t* const* rows, const int16_t* w, int count, int precision,
                     size_t bytes, uint8_t* dst) {
  vertical_tail(rows, w, count, precision, 0, bytes, dst);
}

#ifdef CHUTE_RESAMPLE_X86

// RGB taps in pairs: the int16 lanes (p0.r, p1.r, p0.g, p1.g, p0.b, p1.b, 0, 0)
// from bytes 0..5 (taps k, k+1) or 6..11 (taps k+2, k+3) of a 16-byte load, so
// that one multiply-add with the weight pair (w0, w1) repeated gives the
// three channel sums of two taps.
__attribute__((target("sse4.1"))) inline __m128i rgb_pairs_lo() {
  return _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
}
__attribute__((target("sse4.1"))) inline __m128i rgb_pairs_hi() {
  return _mm_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1);
}

// Four taps of one RGB output pixel into acc.
__attribute__((target("sse4.1"))) inline __m128i rgb_taps4(__m128i acc, const uint8_t* p,
                                                           const int16_t* w, __m128i lo,
                                                           __m128i hi) {
  const __m128i px = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i wv = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w));
  acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_shuffle_epi8(px, lo), _mm_shuffle_epi32(wv, 0x00)));
  return _mm_add_epi32(acc, _mm_madd_epi16(_mm_shuffle_epi8(px, hi), _mm_shuffle_epi32(wv, 0x55)));
}

// Shift, clamp to bytes and store the 3 channel values (plus one byte that
// the next pixel overwrites: outputs are written in increasing order).
__attribute__((target("sse4.1"))) inline void store_rgb(__m128i acc, __m128i shift,
                                                        uint8_t* dst) {
  __m128i v = _mm_sra_epi32(acc, shift);
  v = _mm_packs_epi32(v, v);
  v = _mm_packus_epi16(v, v);
  const int32_t bytes = _mm_cvtsi128_si32(v);
  std::memcpy(dst, &bytes, sizeof(bytes));
}

// Whether the vector loads for output o stay within the readable pixels:
// they read whole groups of 4 taps, 16 bytes from the group's first pixel.
inline bool rgb_vector_safe(const Taps& t, int o, int origin, size_t limit) {
  const size_t taps4 = (static_cast<size_t>(t.count[o]) + 3) & ~size_t{3};
  return (static_cast<size_t>(t.start[o] - origin) + taps4) * 3 + 4 <= limit;
}

__attribute__((target("sse4.1"))) void horizontal_rgb_sse41(const uint8_t* src, int origin,
                                                             int available,
                                                             const AxisTaps& taps, bool flip,
                                                             uint8_t* dst) {
  if (taps.copy) {
    copy_row<3>(src, origin, taps, flip, dst);
    return;
  }
  const Taps t(taps);
  const __m128i lo = rgb_pairs_lo();
  const __m128i hi = rgb_pairs_hi();
  const __m128i round = _mm_set1_epi32(1 << (t.precision - 1));
  const __m128i shift = _mm_cvtsi32_si128(t.precision);
  const size_t limit = static_cast<size_t>(available) * 3;
  const int n = t.out_size;
  for (int d = 0; d < n; ++d) {
    const int o = flip ? n - 1 - d : d;
    if (!rgb_vector_safe(t, o, origin, limit)) {
      pixel_scalar<3>(src, origin, t, o, dst + d * 3);
      continue;
    }
    const uint8_t* p = src + static_cast<size_t>(t.start[o] - origin) * 3;
    const int16_t* w = t.weights_of(o);
    __m128i acc = round;
    for (int k = 0; k < t.count[o]; k += 4) acc = rgb_taps4(acc, p + k * 3, w + k, lo, hi);
    store_rgb(acc, shift, dst + d * 3);
  }
}

__attribute__((target("sse4.1"))) void horizontal_gray_sse41(const uint8_t* src, int origin,
                                                              int available,
                                                              const AxisTaps& taps, bool flip,
                                                              uint8_t* dst) {
  if (taps.copy) {
    copy_row<1>(src, origin, taps, flip, dst);
    return;
  }
  const Taps t(taps);
  const int32_t round = int32_t{1} << (t.precision - 1);
  const int n = t.out_size;
  for (int d = 0; d < n; ++d) {
    const int o = flip ? n - 1 - d : d;
    const int count = t.count[o];
    // Loads read whole groups of 8 taps.
    if (static_cast<size_t>(t.start[o] - origin) +
            ((static_cast<size_t>(count) + 7) & ~size_t{7}) >
        static_cast<size_t>(available)) {
      pixel_scalar<1>(src, origin, t, o, dst + d);
      continue;
    }
    const uint8_t* p = src + (t.start[o] - origin);
    const int16_t* w = t.weights_of(o);
    __m128i acc = _mm_setzero_si128();
    for (int k = 0; k < count; k += 8) {
      const __m128i px = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + k)));
      acc = _mm_add_epi32(acc, _mm_madd_epi16(px, _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k))));
    }
    acc = _mm_add_epi32(acc, _mm_shuffle_epi32(acc, 0x4e));
    acc = _mm_add_epi32(acc, _mm_shuffle_epi32(acc, 0xb1));
    dst[d] = clamp8((_mm_cvtsi128_si32(acc) + round) >> t.precision);
  }
}

// Two weights as the int16 pair a multiply-add lane takes.
inline int32_t weight_pair(const int16_t* w) {
  return static_cast<int32_t>(static_cast<uint16_t>(w[0]) |
                              (static_cast<uint32_t>(static_cast<uint16_t>(w[1])) << 16));
}

// Rows are taken in pairs whose bytes are interleaved into int16 lanes
// (a0, b0, a1, b1, ...), so one multiply-add applies both rows' weights.
// Unpacking and the final packs work within 128-bit lanes and undo each
// other, so the bytes come back in order. Bytes [first, bytes) in 16-byte
// blocks, then the tail.
__attribute__((target("sse4.1"))) void vertical_sse41_from(const uint8_t* const* rows,
                                                            const int16_t* w, int count,
                                                            int precision, size_t first,
                                                            size_t bytes, uint8_t* dst) {
  const __m128i round = _mm_set1_epi32(1 << (precision - 1));
  const __m128i shift = _mm_cvtsi32_si128(precision);
  const __m128i zero = _mm_setzero_si128();
  size_t i = first;
  for (; i + 16 <= bytes; i += 16) {
    __m128i acc0 = round, acc1 = round, acc2 = round, acc3 = round;
    for (int k = 0; k < count; k += 2) {
      // An odd last row pairs with itself at weight 0 (the padding).
      const uint8_t* second = rows[k + 1 < count ? k + 1 : k];
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[k] + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(second + i));
      const __m128i pair = _mm_set1_epi32(weight_pair(w + k));
      const __m128i lo = _mm_unpacklo_epi8(a, b);
      const __m128i hi = _mm_unpackhi_epi8(a, b);
      acc0 = _mm_add_epi32(acc0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), pair));
      acc1 = _mm_add_epi32(acc1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), pair));
      acc2 = _mm_add_epi32(acc2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), pair));
      acc3 = _mm_add_epi32(acc3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), pair));
    }
    const __m128i v01 = _mm_packs_epi32(_mm_sra_epi32(acc0, shift), _mm_sra_epi32(acc1, shift));
    const __m128i v23 = _mm_packs_epi32(_mm_sra_epi32(acc2, shift), _mm_sra_epi32(acc3, shift));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm_packus_epi16(v01, v23));
  }
  vertical_tail(rows, w, count, precision, i, bytes, dst);
}

void vertical_sse41(const uint8_t* const* rows, const int16_t* w, int count, int precision,
                    size_t bytes, uint8_t* dst) {
  vertical_sse41_from(rows, w, count, precision, 0, bytes, dst);
}

__attribute__((target("avx2"))) inline __m256i load_two(const uint8_t* lo, const uint8_t* hi) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
}

// Two output pixels per step, one per 128-bit lane: each lane runs the
// SSE4.1 kernel's 4-tap groups for its pixel (loads, shuffles and weight
// broadcasts all stay within the lane), and the pair shares the loop, the
// rounding and the packing. Every pixel runs the row's largest group count
// (the weights past a pixel's own taps are zero), so the loop's trip count
// never changes between pixels: reductions between 1x and 2x mix 3-, 4- and
// 5-tap pixels, and a branch on each pixel's own count mispredicts. kRows
// rows that share the taps (kRowsAtOnce with the vertical pass first) are
// done pair by pair, so a pair's bounds check and weight vectors are set up
// once for them all.

// The pair's two weight vectors of group g, lane 0 for pixel a, lane 1 for b.
__attribute__((target("avx2"))) inline void pair_weights(const int16_t* wa, const int16_t* wb,
                                                         int g, __m256i* w0, __m256i* w1) {
  const __m256i wv = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(wa + 4 * g))),
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(wb + 4 * g)), 1);
  *w0 = _mm256_shuffle_epi32(wv, 0x00);
  *w1 = _mm256_shuffle_epi32(wv, 0x55);
}

__attribute__((target("avx2"))) inline __m256i pair_group(__m256i acc, const uint8_t* pa,
                                                          const uint8_t* pb, int g, __m256i w0,
                                                          __m256i w1, __m256i lo2,
                                                          __m256i hi2) {
  const __m256i px = load_two(pa + 12 * g, pb + 12 * g);
  acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_shuffle_epi8(px, lo2), w0));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_shuffle_epi8(px, hi2), w1));
}

// Shift, clamp to bytes and store each lane's 3 bytes, plus one byte that
// the next store overwrites (outputs are written in increasing order).
__attribute__((target("avx2"))) inline void store_pair(__m256i acc, __m128i shift,
                                                       uint8_t* dst) {
  __m256i v = _mm256_sra_epi32(acc, shift);
  v = _mm256_packs_epi32(v, v);
  v = _mm256_packus_epi16(v, v);
  const int32_t first = _mm256_cvtsi256_si32(v);
  const int32_t second = _mm256_extract_epi32(v, 4);
  std::memcpy(dst, &first, sizeof(first));
  std::memcpy(dst + 3, &second, sizeof(second));
}

// kGroups: the row's group count, or 0 for any count (more than 12 taps a
// pixel, where the taps outweigh their set-up and each row loads its own).
template <int kGroups, int kRows>
__attribute__((target("avx2"))) void horizontal_rgb_avx2_rows(const uint8_t* const* src_rows,
                                                              int origin, size_t limit,
                                                              const Taps& t, int groups,
                                                              bool flip,
                                                              uint8_t* const* dst_rows) {
  // The row pointers as locals: the byte stores below may alias anything
  // whose address is known outside, so the caller's arrays would be reloaded
  // after each store.
  const uint8_t* src[kRows];
  uint8_t* dst[kRows];
  for (int r = 0; r < kRows; ++r) {
    src[r] = src_rows[r];
    dst[r] = dst_rows[r];
  }
  const __m256i lo2 = _mm256_broadcastsi128_si256(rgb_pairs_lo());
  const __m256i hi2 = _mm256_broadcastsi128_si256(rgb_pairs_hi());
  const __m256i round = _mm256_set1_epi32(1 << (t.precision - 1));
  const __m128i shift = _mm_cvtsi32_si128(t.precision);
  // The loads read `groups` groups of 4 taps, 16 bytes from each group's start.
  const size_t reach = 4 * static_cast<size_t>(groups);
  const int n = t.out_size;
  int d = 0;
  for (; d + 1 < n; d += 2) {
    const int oa = flip ? n - 1 - d : d;
    const int ob = flip ? n - 2 - d : d + 1;
    const size_t ra = static_cast<size_t>(t.start[oa] - origin);
    const size_t rb = static_cast<size_t>(t.start[ob] - origin);
    if ((std::max(ra, rb) + reach) * 3 + 4 > limit) {
      for (int r = 0; r < kRows; ++r) {
        pixel_scalar<3>(src[r], origin, t, oa, dst[r] + d * 3);
        pixel_scalar<3>(src[r], origin, t, ob, dst[r] + d * 3 + 3);
      }
      continue;
    }
    const int16_t* wa = t.weights_of(oa);
    const int16_t* wb = t.weights_of(ob);
    if constexpr (kGroups == 0) {
      for (int r = 0; r < kRows; ++r) {
        __m256i acc = round;
        for (int g = 0; g < groups; ++g) {
          __m256i w0, w1;
          pair_weights(wa, wb, g, &w0, &w1);
          acc = pair_group(acc, src[r] + ra * 3, src[r] + rb * 3, g, w0, w1, lo2, hi2);
        }
        store_pair(acc, shift, dst[r] + d * 3);
      }
    } else {
      __m256i w0[kGroups], w1[kGroups];
      for (int g = 0; g < kGroups; ++g) pair_weights(wa, wb, g, &w0[g], &w1[g]);
      for (int r = 0; r < kRows; ++r) {
        __m256i acc = round;
        for (int g = 0; g < kGroups; ++g) {
          acc = pair_group(acc, src[r] + ra * 3, src[r] + rb * 3, g, w0[g], w1[g], lo2, hi2);
        }
        store_pair(acc, shift, dst[r] + d * 3);
      }
    }
  }
  if (d < n) {
    const int o = flip ? 0 : d;
    const bool vector = rgb_vector_safe(t, o, origin, limit);
    const int16_t* w = t.weights_of(o);
    for (int r = 0; r < kRows; ++r) {
      if (!vector) {
        pixel_scalar<3>(src[r], origin, t, o, dst[r] + d * 3);
        continue;
      }
      const uint8_t* p = src[r] + static_cast<size_t>(t.start[o] - origin) * 3;
      __m128i acc = _mm_set1_epi32(1 << (t.precision - 1));
      for (int k = 0; k < t.count[o]; k += 4) {
        acc = rgb_taps4(acc, p + k * 3, w + k, rgb_pairs_lo(), rgb_pairs_hi());
      }
      store_rgb(acc, shift, dst[r] + d * 3);
    }
  }
}

template <int kRows>
__attribute__((target("avx2"))) void horizontal_rgb_avx2_any(const uint8_t* const* src,
                                                             int origin, int available,
                                                             const AxisTaps& taps, bool flip,
                                                             uint8_t* const* dst) {
  if (taps.copy) {
    for (int r = 0; r < kRows; ++r) copy_row<3>(src[r], origin, taps, flip, dst[r]);
    return;
  }
  const Taps t(taps);
  const size_t limit = static_cast<size_t>(available) * 3;
  const int groups = (taps.max_count + 3) >> 2;
  switch (groups) {
    case 1:
      return horizontal_rgb_avx2_rows<1, kRows>(src, origin, limit, t, groups, flip, dst);
    case 2:
      return horizontal_rgb_avx2_rows<2, kRows>(src, origin, limit, t, groups, flip, dst);
    case 3:
      return horizontal_rgb_avx2_rows<3, kRows>(src, origin, limit, t, groups, flip, dst);
    default:
      return horizontal_rgb_avx2_rows<0, kRows>(src, origin, limit, t, groups, flip, dst);
  }
}

void horizontal_rgb_avx2(const uint8_t* src, int origin, int available, const AxisTaps& taps,
                         bool flip, uint8_t* dst) {
  horizontal_rgb_avx2_any<1>(&src, origin, available, taps, flip, &dst);
}

void horizontal_rgb_rows_avx2(const uint8_t* const* src, int origin, int available,
                              const AxisTaps& taps, bool flip, uint8_t* const* dst) {
  horizontal_rgb_avx2_any<kRowsAtOnce>(src, origin, available, taps, flip, dst);
}

__attribute__((target("avx2"))) void vertical_avx2(const uint8_t* const* rows, const int16_t* w,
                                                   int count, int precision, size_t bytes,
                                                   uint8_t* dst) {
  const __m256i round = _mm256_set1_epi32(1 << (precision - 1));
  const __m128i shift = _mm_cvtsi32_si128(precision);
  const __m256i zero = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    __m256i acc0 = round, acc1 = round, acc2 = round, acc3 = round;
    for (int k = 0; k < count; k += 2) {
      const uint8_t* second = rows[k + 1 < count ? k + 1 : k];
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[k] + i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second + i));
      const __m256i pair = _mm256_set1_epi32(weight_pair(w + k));
      const __m256i lo = _mm256_unpacklo_epi8(a, b);
      const __m256i hi = _mm256_unpackhi_epi8(a, b);
      acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), pair));
      acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), pair));
      acc2 = _mm256_add_epi32(acc2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), pair));
      acc3 = _mm256_add_epi32(acc3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), pair));
    }
    const __m256i v01 =
        _mm256_packs_epi32(_mm256_sra_epi32(acc0, shift), _mm256_sra_epi32(acc1, shift));
    const __m256i v23 =
        _mm256_packs_epi32(_mm256_sra_epi32(acc2, shift), _mm256_sra_epi32(acc3, shift));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_packus_epi16(v01, v23));
  }
  vertical_sse41_from(rows, w, count, precision, i, bytes, dst);
}

#endif  // CHUTE_RESAMPLE_X86

const ResampleKernelSet kScalarKernels{horizontal_scalar<1>, horizontal_scalar<3>,
                                       vertical_scalar};
#ifdef CHUTE_RESAMPLE_X86
const ResampleKernelSet kSse41Kernels{horizontal_gray_sse41, horizontal_rgb_sse41,
                                      vertical_sse41};
// Gray keeps the SSE4.1 loop: 8 taps cover a reduction of up to ~4x, and
// gray images are rare enough not to need a wider one.
const ResampleKernelSet kAvx2Kernels{horizontal_gray_sse41, horizontal_rgb_avx2, vertical_avx2,
                                     horizontal_rgb_rows_avx2};
#endif

bool cpu_has(SimdLevel level) {
#ifdef CHUTE_RESAMPLE_X86
  switch (level) {
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("sse4.1");
    case SimdLevel::kSse41:
      return __builtin_cpu_supports("sse4.1");
    default:
      return true;
  }
#else
  return level == SimdLevel::kScalar || level == SimdLevel::kAuto;
#endif
}

}  // namespace

SimdLevel best_simd_level() {
  static const SimdLevel best = [] {
    if (cpu_has(SimdLevel::kAvx2)) return SimdLevel::kAvx2;
    if (cpu_has(SimdLevel::kSse41)) return SimdLevel::kSse41;
    return SimdLevel::kScalar;
  }();
  return best;
}

const ResampleKernelSet& resample_kernels(SimdLevel level) {
  if (level == SimdLevel::kAuto) level = best_simd_level();
  CHUTE_CHECK(cpu_has(level), kUsage, "this CPU lacks the requested SIMD level");
  switch (level) {
#ifdef CHUTE_RESAMPLE_X86
    case SimdLevel::kAvx2:
      return kAvx2Kernels;
    case SimdLevel::kSse41:
      return kSse41Kernels;
#endif
    default:
      return kScalarKernels;
  }
}

}  // namespace chute

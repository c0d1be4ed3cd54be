#include "image/transform.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/error.h"

namespace chute {
namespace {

// For each output pixel along one axis: the first input pixel it reads and
// its normalized weights. A triangle (bilinear) filter whose support grows
// with the shrink factor, so that shrinking averages every input pixel
// instead of sampling a few (aliasing). The same scheme as Pillow's
// reducing resample; the arithmetic differs, so results may differ by 1.
struct Taps {
  int max_taps = 0;
  std::vector<int> start;
  std::vector<int> count;
  std::vector<float> weights;  // max_taps per output pixel
};

Taps make_taps(int in_size, int out_size) {
  Taps taps;
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle's radius is 1 input pixel, scaled
  taps.max_taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  taps.start.resize(out_size);
  taps.count.resize(out_size);
  taps.weights.assign(static_cast<size_t>(out_size) * taps.max_taps, 0.0f);
  for (int o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    int lo = static_cast<int>(std::floor(center - support + 0.5));
    int hi = static_cast<int>(std::floor(center + support + 0.5));
    lo = std::max(lo, 0);
    hi = std::min(hi, in_size);
    hi = std::min(hi, lo + taps.max_taps);
    float* w = &taps.weights[static_cast<size_t>(o) * taps.max_taps];
    double total = 0.0;
    for (int i = lo; i < hi; ++i) {
      const double d = std::abs((i + 0.5 - center) / filter_scale);
      const double v = d < 1.0 ? 1.0 - d : 0.0;
      w[i - lo] = static_cast<float>(v);
      total += v;
    }
    if (total <= 0.0) {
      // Cannot happen for in_size >= 1 (the nearest pixel has d < 1), but a
      // zero division would write NaN-derived garbage; fall back to it.
      lo = std::min(static_cast<int>(center), in_size - 1);
      hi = lo + 1;
      w[0] = 1.0f;
      total = 1.0;
    }
    for (int i = 0; i < hi - lo; ++i) w[i] = static_cast<float>(w[i] / total);
    taps.start[o] = lo;
    taps.count[o] = hi - lo;
  }
  return taps;
}

uint8_t to_u8(float v) {
  // Weights sum to 1, so v is in [0, 255] up to rounding error; +0.5 rounds.
  const int r = static_cast<int>(v + 0.5f);
  return static_cast<uint8_t>(std::clamp(r, 0, 255));
}

int output_extent(int spec_size, int image_size) { return spec_size > 0 ? spec_size : image_size; }

}  // namespace

void resize_bilinear(const uint8_t* src, int src_h, int src_w, int channels, uint8_t* dst,
                     int dst_h, int dst_w) {
  CHUTE_CHECK(src_h > 0 && src_w > 0 && dst_h > 0 && dst_w > 0 && channels > 0, kUsage,
              "resize from " << src_h << "x" << src_w << " to " << dst_h << "x" << dst_w
                             << " with " << channels << " channels");
  if (src_h == dst_h && src_w == dst_w) {
    std::memcpy(dst, src, static_cast<size_t>(src_h) * src_w * channels);
    return;
  }
  const Taps tx = make_taps(src_w, dst_w);
  const Taps ty = make_taps(src_h, dst_h);
  // Horizontal pass into floats (no rounding between the passes), then
  // vertical. A row of the intermediate is dst_w * channels floats.
  const size_t mid_row = static_cast<size_t>(dst_w) * channels;
  std::vector<float> mid(static_cast<size_t>(src_h) * mid_row);
  for (int y = 0; y < src_h; ++y) {
    const uint8_t* in = src + static_cast<size_t>(y) * src_w * channels;
    float* m = &mid[y * mid_row];
    for (int x = 0; x < dst_w; ++x) {
      const float* w = &tx.weights[static_cast<size_t>(x) * tx.max_taps];
      const uint8_t* p = in + static_cast<size_t>(tx.start[x]) * channels;
      for (int c = 0; c < channels; ++c) {
        float acc = 0.0f;
        for (int k = 0; k < tx.count[x]; ++k) acc += w[k] * p[k * channels + c];
        m[x * channels + c] = acc;
      }
    }
  }
  std::vector<float> acc(mid_row);
  for (int y = 0; y < dst_h; ++y) {
    const float* w = &ty.weights[static_cast<size_t>(y) * ty.max_taps];
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int k = 0; k < ty.count[y]; ++k) {
      const float* m = &mid[(ty.start[y] + k) * mid_row];
      const float wk = w[k];
      for (size_t i = 0; i < mid_row; ++i) acc[i] += wk * m[i];
    }
    uint8_t* out = dst + y * mid_row;
    for (size_t i = 0; i < mid_row; ++i) out[i] = to_u8(acc[i]);
  }
}

ImageSize resize_target(int h, int w, const ImageOutputSpec& spec) {
  const int oh = output_extent(spec.out_height, h);
  const int ow = output_extent(spec.out_width, w);
  if (spec.crop == CropMode::kNone) return {oh, ow};
  // Cover the output: the side with the larger ratio out/in matches exactly,
  // the other is scaled by the same ratio (rounded) and is at least as big.
  const int64_t H = h, W = w;
  if (int64_t{oh} * W >= int64_t{ow} * H) {
    const int64_t nw = (W * oh + H / 2) / H;
    return {oh, static_cast<int>(std::max<int64_t>(nw, ow))};
  }
  const int64_t nh = (H * ow + W / 2) / W;
  return {static_cast<int>(std::max<int64_t>(nh, oh)), ow};
}

void center_crop_origin(int h, int w, const ImageOutputSpec& spec, int* crop_y, int* crop_x) {
  const int oh = output_extent(spec.out_height, h);
  const int ow = output_extent(spec.out_width, w);
  CHUTE_CHECK(oh <= h && ow <= w, kUsage,
              "crop of " << oh << "x" << ow << " from a " << h << "x" << w << " image");
  *crop_y = (h - oh) / 2;
  *crop_x = (w - ow) / 2;
}

namespace {

// webdataset computes astype("f") / 255.0: a float32 divided by 255 in
// float32 (NEP 50 keeps the Python float weak). One IEEE division per value,
// tabulated; no reciprocal multiply, which would differ in the last bit.
const std::array<float, 256>& float_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = static_cast<float>(i) / 255.0f;
    return t;
  }();
  return table;
}

// Splitting RGB into planes is the whole cost of a CHW uint8 output. Written
// per byte, it ran at ~2 cycles per byte (about a quarter of a 256x256 decode)
// because compilers do not vectorize a stride-3 gather well; with SSSE3
// shuffles it is 16 pixels per 3 loads and 3 stores.
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

void split_rgb(const uint8_t* src, size_t n, uint8_t* r, uint8_t* g, uint8_t* b) {
  static const SplitRgb impl = pick_split_rgb();
  impl(src, n, r, g, b);
}

}  // namespace

ImageWriter::ImageWriter(int h, int w, const ImageOutputSpec& spec, int crop_y, int crop_x,
                         bool flip, void* out)
    : h_(h),
      w_(w),
      channels_(spec.channels),
      crop_y_(crop_y),
      crop_x_(crop_x),
      out_h_(output_extent(spec.out_height, h)),
      out_w_(output_extent(spec.out_width, w)),
      flip_(flip),
      out_(out) {
  CHUTE_CHECK(channels_ == 1 || channels_ == 3, kUsage,
              "image output with " << channels_ << " channels (1 or 3 expected)");
  CHUTE_CHECK(crop_y >= 0 && crop_x >= 0 && crop_y + out_h_ <= h && crop_x + out_w_ <= w, kUsage,
              "crop window " << out_h_ << "x" << out_w_ << " at (" << crop_y << ", " << crop_x
                             << ") does not fit a " << h << "x" << w << " image");
  // Channel count, layout and dtype as template arguments: the per-pixel loop
  // then has no branches and unrolls (a generic loop cost ~2 ns per value, as
  // much as decoding a small JPEG).
  if (spec.to_float) {
    if (channels_ == 1) {
      emit_ = emit_rows<1, false, float, true>;
    } else {
      emit_ = spec.chw ? emit_rows<3, true, float, true> : emit_rows<3, false, float, true>;
    }
  } else {
    if (channels_ == 1) {
      emit_ = emit_rows<1, false, uint8_t, false>;
    } else {
      emit_ = spec.chw ? emit_rows<3, true, uint8_t, false> : emit_rows<3, false, uint8_t, false>;
    }
  }
}

void ImageWriter::begin(int height, int width, int channels) {
  // The batch slot was sized from the probed header; a decoder that disagrees
  // (it read the same bytes) must not write past it.
  CHUTE_CHECK(height == h_ && width == w_ && channels == channels_, kData,
              "decoded image is " << height << "x" << width << "x" << channels << ", expected "
                                  << h_ << "x" << w_ << "x" << channels_);
}

void ImageWriter::rows(const uint8_t* hwc, size_t stride, int first_row, int count) {
  // The output rows whose source row lies in this band.
  const int y_begin = std::max(first_row, crop_y_) - crop_y_;
  const int y_end = std::min(first_row + count, crop_y_ + out_h_) - crop_y_;
  if (y_begin < y_end) emit_(*this, hwc, stride, first_row, y_begin, y_end);
}

template <int C, bool CHW, typename T, bool Float>
void ImageWriter::emit_rows(const ImageWriter& w, const uint8_t* band, size_t stride,
                            int first_row, int y_begin, int y_end) {
  const size_t plane = static_cast<size_t>(w.out_h_) * w.out_w_;
  const std::ptrdiff_t step = w.flip_ ? -C : C;
  const float* to_float = float_table().data();
  auto convert = [to_float](uint8_t v) {
    if constexpr (Float) {
      return to_float[v];
    } else {
      return v;
    }
  };
  T* dst = static_cast<T*>(w.out_);
  for (int y = y_begin; y < y_end; ++y) {
    const uint8_t* row = band + static_cast<size_t>(w.crop_y_ + y - first_row) * stride +
                         static_cast<size_t>(w.crop_x_) * C;
    const size_t row_start = static_cast<size_t>(y) * w.out_w_;
    if constexpr (!Float) {
      if (!w.flip_) {
        if constexpr (CHW) {
          split_rgb(row, w.out_w_, dst + row_start, dst + plane + row_start,
                    dst + 2 * plane + row_start);
        } else {
          std::memcpy(dst + row_start * C, row, static_cast<size_t>(w.out_w_) * C);
        }
        continue;
      }
    }
    const uint8_t* px = w.flip_ ? row + static_cast<size_t>(w.out_w_ - 1) * C : row;
    if constexpr (CHW) {
      T* planes[C];
      for (int c = 0; c < C; ++c) planes[c] = dst + c * plane + row_start;
      for (int x = 0; x < w.out_w_; ++x, px += step) {
        for (int c = 0; c < C; ++c) planes[c][x] = convert(px[c]);
      }
    } else {
      T* out = dst + row_start * C;
      for (int x = 0; x < w.out_w_; ++x, px += step) {
        for (int c = 0; c < C; ++c) out[static_cast<size_t>(x) * C + c] = convert(px[c]);
      }
    }
  }
}

void write_image_output(const uint8_t* hwc, int h, int w, const ImageOutputSpec& spec, int crop_y,
                        int crop_x, bool flip, void* out) {
  ImageWriter writer(h, w, spec, crop_y, crop_x, flip, out);
  writer.rows(hwc, static_cast<size_t>(w) * spec.channels, 0, h);
}

}  // namespace chute

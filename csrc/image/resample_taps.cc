#include "image/resample_taps.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/error.h"

namespace chute {
namespace {

constexpr int kMaxPrecision = 22;  // Pillow's PRECISION_BITS for 8-bit images
constexpr int kStrideMultiple = 16;

double triangle(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

std::shared_ptr<AxisTaps> build_taps(int in_size, double in0, double in1, int out_size) {
  // Pillow's precompute_coeffs for the bilinear filter (support 1): the same
  // centres, bounds (including its truncating casts) and normalisation, so
  // the real-valued weights are Pillow's.
  const double scale = (in1 - in0) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;
  const double inv_filter_scale = 1.0 / filter_scale;
  const int max_taps = static_cast<int>(std::min<double>(std::ceil(support) * 2 + 1, in_size));

  auto taps = std::make_shared<AxisTaps>();
  taps->out_size = out_size;
  taps->start.resize(out_size);
  taps->count.resize(out_size);
  std::vector<double> real(static_cast<size_t>(out_size) * max_taps, 0.0);
  double max_weight = 0.0;
  for (int o = 0; o < out_size; ++o) {
    const double center = in0 + (o + 0.5) * scale;
    const int lo = std::max(0, static_cast<int>(center - support + 0.5));
    const int hi = std::min(in_size, static_cast<int>(center + support + 0.5));
    const int n = std::min(std::max(hi - lo, 1), max_taps);
    double* w = &real[static_cast<size_t>(o) * max_taps];
    double total = 0.0;
    for (int i = 0; i < n; ++i) {
      w[i] = triangle((i + lo - center + 0.5) * inv_filter_scale);
      total += w[i];
    }
    if (total != 0.0) {
      for (int i = 0; i < n; ++i) w[i] /= total;
    }
    for (int i = 0; i < n; ++i) max_weight = std::max(max_weight, w[i]);
    taps->start[o] = lo;
    taps->count[o] = n;
  }

  // The highest precision at which every weight fits an int16.
  int precision = kMaxPrecision;
  while (precision > 1 &&
         static_cast<int64_t>(0.5 + max_weight * static_cast<double>(int64_t{1} << precision)) >
             32767) {
    --precision;
  }
  taps->precision = precision;
  const double one = static_cast<double>(int64_t{1} << precision);

  // Quantize, then drop the taps whose weight rounded to 0 at either end
  // (the triangle's zero-weight edges): they cost a multiply and a load each.
  std::vector<int16_t> fixed(static_cast<size_t>(out_size) * max_taps, 0);
  int max_count = 1;
  for (int o = 0; o < out_size; ++o) {
    const double* w = &real[static_cast<size_t>(o) * max_taps];
    int16_t* q = &fixed[static_cast<size_t>(o) * max_taps];
    int n = taps->count[o];
    for (int i = 0; i < n; ++i) q[i] = static_cast<int16_t>(0.5 + w[i] * one);
    int first = 0;
    while (first < n - 1 && q[first] == 0) ++first;
    while (n - 1 > first && q[n - 1] == 0) --n;
    if (first > 0) std::copy(q + first, q + n, q);
    taps->start[o] += first;
    taps->count[o] = n - first;
    max_count = std::max(max_count, n - first);
  }
  taps->max_count = max_count;
  taps->stride = (max_count + kStrideMultiple - 1) / kStrideMultiple * kStrideMultiple;
  taps->weights.assign(static_cast<size_t>(out_size) * taps->stride, 0);
  bool copy = true;
  for (int o = 0; o < out_size; ++o) {
    const int16_t* q = &fixed[static_cast<size_t>(o) * max_taps];
    std::copy(q, q + taps->count[o], &taps->weights[static_cast<size_t>(o) * taps->stride]);
    copy = copy && taps->count[o] == 1 && q[0] == (1 << precision) &&
           taps->start[o] == taps->start[0] + o;
  }
  taps->copy = copy;
  return taps;
}

struct CacheKey {
  int in_size;
  double in0;
  double in1;
  int out_size;
  bool operator==(const CacheKey& o) const {
    return in_size == o.in_size && in0 == o.in0 && in1 == o.in1 && out_size == o.out_size;
  }
};

// A few tables per thread, least recently used out: the two axes of the
// current size pair, and room for a few size pairs that alternate.
class TapCache {
 public:
  std::shared_ptr<const AxisTaps> get(const CacheKey& key) {
    ++clock_;
    Entry* oldest = &entries_[0];
    for (Entry& e : entries_) {
      if (e.taps && e.key == key) {
        e.used = clock_;
        return e.taps;
      }
      if (e.used < oldest->used) oldest = &e;
    }
    oldest->key = key;
    oldest->taps = build_taps(key.in_size, key.in0, key.in1, key.out_size);
    oldest->used = clock_;
    return oldest->taps;
  }

 private:
  struct Entry {
    CacheKey key{};
    std::shared_ptr<const AxisTaps> taps;
    uint64_t used = 0;
  };
  std::array<Entry, 8> entries_{};
  uint64_t clock_ = 0;
};

}  // namespace

std::shared_ptr<const AxisTaps> axis_taps(int in_size, double in0, double in1, int out_size) {
  CHUTE_CHECK(in_size > 0 && out_size > 0 && in0 >= 0 && in0 < in1 && in1 <= in_size, kUsage,
              "resample of [" << in0 << ", " << in1 << ") out of " << in_size << " pixels to "
                              << out_size);
  thread_local TapCache cache;
  return cache.get({in_size, in0, in1, out_size});
}

}  // namespace chute

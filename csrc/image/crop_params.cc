#include "image/crop_params.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace chute {
namespace {

// Python's round() to an int: half to even (nearbyint in the default mode).
int64_t round_half_even(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

// U[0, 1) with 53 random bits.
double uniform01(Rng& rng) { return static_cast<double>(rng.next() >> 11) * 0x1.0p-53; }

}  // namespace

Window random_resized_crop(int height, int width, double scale_lo, double scale_hi,
                           double ratio_lo, double ratio_hi, Rng& rng) {
  CHUTE_CHECK(height > 0 && width > 0, kUsage,
              "random resized crop of a " << height << "x" << width << " image");
  CHUTE_CHECK(std::isfinite(scale_lo) && std::isfinite(scale_hi) && scale_lo >= 0 &&
                  scale_lo <= scale_hi,
              kUsage, "scale must be (min, max) with 0 <= min <= max, got (" << scale_lo << ", "
                                                                              << scale_hi << ")");
  CHUTE_CHECK(std::isfinite(ratio_lo) && std::isfinite(ratio_hi) && ratio_lo > 0 &&
                  ratio_lo <= ratio_hi,
              kUsage, "ratio must be (min, max) with 0 < min <= max, got (" << ratio_lo << ", "
                                                                            << ratio_hi << ")");
  const double area = static_cast<double>(height) * width;
  const double log_lo = std::log(ratio_lo);
  const double log_hi = std::log(ratio_hi);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * (scale_lo + (scale_hi - scale_lo) * uniform01(rng));
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * uniform01(rng));
    const int64_t w = round_half_even(std::sqrt(target_area * aspect));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const auto top = static_cast<int>(rng.below(static_cast<uint64_t>(height - h) + 1));
      const auto left = static_cast<int>(rng.below(static_cast<uint64_t>(width - w) + 1));
      return Window{top, left, static_cast<int>(h), static_cast<int>(w)};
    }
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width;
  int64_t h = height;
  if (in_ratio < ratio_lo) {
    h = std::clamp<int64_t>(round_half_even(static_cast<double>(w) / ratio_lo), 1, height);
  } else if (in_ratio > ratio_hi) {
    w = std::clamp<int64_t>(round_half_even(static_cast<double>(h) * ratio_hi), 1, width);
  }
  return Window{static_cast<int>((height - h) / 2), static_cast<int>((width - w) / 2),
                static_cast<int>(h), static_cast<int>(w)};
}

Extent resize_shorter_side(int height, int width, int resize) {
  CHUTE_CHECK(height > 0 && width > 0 && resize > 0, kUsage,
              "resize " << resize << " of a " << height << "x" << width << " image");
  const int shorter = std::min(height, width);
  const int longer = std::max(height, width);
  const double resized_long = static_cast<double>(resize) * longer / shorter;
  CHUTE_CHECK(resized_long < double{1 << 30}, kUsage,
              "resize " << resize << " of a " << height << "x" << width << " image is too large");
  const int new_long = static_cast<int>(resized_long);
  return width <= height ? Extent{new_long, resize} : Extent{resize, new_long};
}

Extent cover_size(int height, int width, int out_h, int out_w) {
  CHUTE_CHECK(height > 0 && width > 0 && out_h > 0 && out_w > 0, kUsage,
              "cover " << out_h << "x" << out_w << " with a " << height << "x" << width
                       << " image");
  const int64_t h = height, w = width;
  if (int64_t{out_h} * w >= int64_t{out_w} * h) {
    const int64_t nw = (w * out_h + h / 2) / h;
    CHUTE_CHECK(nw < int64_t{1} << 30, kUsage,
                "covering " << out_h << "x" << out_w << " with a " << height << "x" << width
                            << " image is too large");
    return {out_h, static_cast<int>(std::max<int64_t>(nw, out_w))};
  }
  const int64_t nh = (h * out_w + w / 2) / w;
  CHUTE_CHECK(nh < int64_t{1} << 30, kUsage,
              "covering " << out_h << "x" << out_w << " with a " << height << "x" << width
                          << " image is too large");
  return {static_cast<int>(std::max<int64_t>(nh, out_h)), out_w};
}

SourceArea resized_crop_area(int height, int width, Extent resized, const Window& crop) {
  CHUTE_CHECK(height > 0 && width > 0 && crop.y >= 0 && crop.x >= 0 && crop.height > 0 &&
                  crop.width > 0 && crop.y + crop.height <= resized.height &&
                  crop.x + crop.width <= resized.width,
              kUsage,
              "crop " << crop.height << "x" << crop.width << " at (" << crop.y << ", " << crop.x
                      << ") of a " << height << "x" << width << " image resized to "
                      << resized.height << "x" << resized.width);
  // Output pixel i of the resize samples source position (i + 0.5) * scale;
  // the box maps the crop's rows and columns onto the same positions.
  const double sy = static_cast<double>(height) / resized.height;
  const double sx = static_cast<double>(width) / resized.width;
  SourceArea area;
  area.region = Window{0, 0, height, width};
  area.box = Box{crop.y * sy, crop.x * sx, std::min<double>((crop.y + crop.height) * sy, height),
                 std::min<double>((crop.x + crop.width) * sx, width)};
  return area;
}

SourceArea resize_center_crop(int height, int width, int resize, int crop_h, int crop_w) {
  CHUTE_CHECK(height > 0 && width > 0 && resize > 0 && crop_h > 0 && crop_w > 0, kUsage,
              "resize " << resize << " and center crop " << crop_h << "x" << crop_w << " of a "
                        << height << "x" << width << " image");
  const Extent resized = resize_shorter_side(height, width, resize);
  CHUTE_CHECK(crop_h <= resized.height && crop_w <= resized.width, kUsage,
              "center crop " << crop_h << "x" << crop_w << " of a " << height << "x" << width
                             << " image resized to " << resized.height << "x" << resized.width
                             << " (torchvision would pad; chute does not)");
  const auto top = static_cast<int>(round_half_even((resized.height - crop_h) / 2.0));
  const auto left = static_cast<int>(round_half_even((resized.width - crop_w) / 2.0));
  return resized_crop_area(height, width, resized, Window{top, left, crop_h, crop_w});
}

}  // namespace chute

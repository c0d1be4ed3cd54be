#include "image/output_spec.h"

#include <cmath>

#include "core/error.h"
#include "image/crop_params.h"

namespace chute {

void check_output_spec(const ImageOutputSpec& s, const std::string& field) {
  CHUTE_CHECK((s.out_height == 0 && s.out_width == 0) || (s.out_height > 0 && s.out_width > 0),
              kUsage,
              "field '" << field << "': output size " << s.out_height << "x" << s.out_width
                        << " needs a positive height and width (or neither)");
  CHUTE_CHECK(s.resize >= 0, kUsage, "field '" << field << "': resize must be positive");
  CHUTE_CHECK(s.resize == 0 || (s.resizes() && (s.crop == CropMode::kCenter ||
                                                s.crop == CropMode::kRandom)),
              kUsage,
              "field '" << field
                        << "': resize goes with an output size and a 'center' or 'random' crop");
  CHUTE_CHECK(s.resize == 0 || (s.out_height <= s.resize && s.out_width <= s.resize), kUsage,
              "field '" << field << "': a " << s.out_height << "x" << s.out_width
                        << " crop does not fit an image resized to " << s.resize
                        << " on its shorter side");
  CHUTE_CHECK(s.crop != CropMode::kRandomResized || s.resizes(), kUsage,
              "field '" << field << "': a random resized crop needs an output size");
  CHUTE_CHECK(std::isfinite(s.scale_min) && std::isfinite(s.scale_max) && s.scale_min >= 0 &&
                  s.scale_min <= s.scale_max,
              kUsage,
              "field '" << field << "': scale must be (min, max) with 0 <= min <= max, got ("
                        << s.scale_min << ", " << s.scale_max << ")");
  CHUTE_CHECK(std::isfinite(s.ratio_min) && std::isfinite(s.ratio_max) && s.ratio_min > 0 &&
                  s.ratio_min <= s.ratio_max,
              kUsage,
              "field '" << field << "': ratio must be (min, max) with 0 < min <= max, got ("
                        << s.ratio_min << ", " << s.ratio_max << ")");
  CHUTE_CHECK(!s.normalize || s.dtype != PixelType::kUint8, kUsage,
              "field '" << field
                        << "': normalisation needs a float output type (float32, float16 or "
                           "bfloat16)");
  // OutputFormat checks the means and deviations themselves.
  output_format(s);
}

OutputFormat output_format(const ImageOutputSpec& s) {
  if (s.normalize) return OutputFormat(s.layout, s.dtype, s.mean, s.std);
  return OutputFormat(s.layout, s.dtype);
}

ImagePlacement place_image(const ImageOutputSpec& s, int height, int width, Rng& rng) {
  ImagePlacement placement;
  const Window whole{0, 0, height, width};
  if (!s.resizes() || s.crop == CropMode::kNone) {
    placement.area = crop_area(whole);
  } else if (s.crop == CropMode::kRandomResized) {
    placement.area = crop_area(random_resized_crop(height, width, s.scale_min, s.scale_max,
                                                   s.ratio_min, s.ratio_max, rng));
  } else if (s.crop == CropMode::kCenter && s.resize > 0) {
    placement.area = resize_center_crop(height, width, s.resize, s.out_height, s.out_width);
  } else {
    const Extent resized = s.resize > 0 ? resize_shorter_side(height, width, s.resize)
                                        : cover_size(height, width, s.out_height, s.out_width);
    Window crop{0, 0, s.out_height, s.out_width};
    if (s.crop == CropMode::kRandom) {
      crop.y = static_cast<int>(rng.below(static_cast<uint64_t>(resized.height - crop.height) + 1));
      crop.x = static_cast<int>(rng.below(static_cast<uint64_t>(resized.width - crop.width) + 1));
    } else {
      crop.y = (resized.height - crop.height) / 2;
      crop.x = (resized.width - crop.width) / 2;
    }
    placement.area = resized_crop_area(height, width, resized, crop);
  }
  placement.flip = s.random_flip && (rng.next() & 1) != 0;
  return placement;
}

}  // namespace chute

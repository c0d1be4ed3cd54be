// What becomes of each image of an image field before it joins a batch: the
// output size, the crop and resize that get there (torchvision's transforms),
// a random horizontal flip, and the layout, element type and normalisation
// of the written pixels. Python's decode(...) options, one to one.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/random.h"
#include "image/pixel_format.h"
#include "image/resample.h"

namespace chute {

enum class CropMode : uint8_t {
  kNone,           // resize to the output size; the aspect ratio is not kept
  kCenter,         // cover the output (or Resize(resize)), then the centre crop
  kRandom,         // cover the output (or Resize(resize)), then a crop at a random place
  kRandomResized,  // torchvision's RandomResizedCrop(size, scale, ratio)
};

struct ImageOutputSpec {
  Layout layout = Layout::kHWC;  // RGB only; gray images are HW (or HW1, see squeeze_gray)
  PixelType dtype = PixelType::kUint8;
  bool squeeze_gray = true;  // gray images as HW (webdataset's l8), not HW1
  // Both 0: the decoded size (no resize, no crop); else both positive.
  int out_height = 0;
  int out_width = 0;
  // kCenter and kRandom: torchvision's Resize(resize) first (shorter side to
  // `resize`), instead of the smallest size that covers the output.
  int resize = 0;
  CropMode crop = CropMode::kCenter;
  // kRandomResized: area fraction and aspect ratio ranges.
  double scale_min = 0.08;
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;
  double ratio_max = 4.0 / 3.0;
  bool random_flip = false;  // mirror each image with probability 1/2
  // Float types only: (v / 255 - mean[c]) / std[c] (see pixel_format.h).
  bool normalize = false;
  std::array<float, 3> mean{0.0f, 0.0f, 0.0f};
  std::array<float, 3> std{1.0f, 1.0f, 1.0f};

  bool resizes() const { return out_height > 0; }
};

// kUsage naming `field` for a spec that cannot work (sizes, ranges, a
// normalisation without a float type, a resize with a crop that ignores it).
void check_output_spec(const ImageOutputSpec& spec, const std::string& field);

// The layout, type and normalisation of the written pixels.
OutputFormat output_format(const ImageOutputSpec& spec);

// Where one image's output comes from: the area of the height x width
// source it resamples, and whether it is mirrored.
struct ImagePlacement {
  SourceArea area;
  bool flip = false;
};

// The placement of one image. Random choices come from `rng` in a fixed
// order: the crop's draws first (kRandom: top, then left; kRandomResized:
// torchvision's get_params), then one draw for the flip when random_flip.
// kUsage for a spec check_output_spec refuses.
ImagePlacement place_image(const ImageOutputSpec& spec, int height, int width, Rng& rng);

}  // namespace chute

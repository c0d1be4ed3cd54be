// Where the training and evaluation crops come from, with torchvision's
// semantics, as source areas for the resampler (image/resample.h).
#pragma once

#include "image/resample.h"
#include "core/random.h"

namespace chute {

// torchvision's RandomResizedCrop.get_params for an image of height x width:
// up to 10 attempts of area * U(scale) pixels at aspect ratio
// exp(U(log ratio_lo, log ratio_hi)), w = round(sqrt(area * aspect)),
// h = round(sqrt(area / aspect)) (half to even, as Python's round), accepted
// when 0 < w <= width and 0 < h <= height, at top = randint(0, height - h),
// left = randint(0, width - w) (inclusive). Otherwise the centred fallback:
// the image's ratio clamped into [ratio_lo, ratio_hi]. Where torchvision's
// fallback would give an empty side (a 1-pixel-wide image with ratio_lo > 2),
// the side is 1 pixel. kUsage unless 0 <= scale_lo <= scale_hi and
// 0 < ratio_lo <= ratio_hi, all finite.
Window random_resized_crop(int height, int width, double scale_lo, double scale_hi,
                           double ratio_lo, double ratio_hi, Rng& rng);

// torchvision's Resize(resize) then CenterCrop((crop_h, crop_w)) as one
// resample: the shorter side becomes `resize`, the longer
// int(resize * long / short) (truncated, as torchvision computes it), the
// crop starts at int(round((resized - crop) / 2.0)) (half to even); the area
// is the whole image (the resize reads across the crop's edges) with the
// crop's preimage as the box. kUsage when the crop is larger than the
// resized image (torchvision pads there).
SourceArea resize_center_crop(int height, int width, int resize, int crop_h, int crop_w);

}  // namespace chute

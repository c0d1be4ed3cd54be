// Where the training and evaluation crops come from, with torchvision's
// semantics, as source areas for the resampler (image/resample.h).
#pragma once

#include "core/random.h"
#include "image/resample.h"

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

// The size of an image after a resize: height and width in pixels.
struct Extent {
  int height = 0;
  int width = 0;
};

// torchvision's Resize(resize) of a height x width image: the shorter side
// becomes `resize`, the longer int(resize * long / short). kUsage when that is
// too large to address.
Extent resize_shorter_side(int height, int width, int resize);

// The smallest size with the image's aspect ratio that covers out_h x out_w:
// the side with the larger ratio out / in matches exactly, the other is
// scaled by the same ratio, rounded half up, and is at least its output size.
Extent cover_size(int height, int width, int out_h, int out_w);

// `crop` (a window of the image resized to `resized`) as an area of the
// height x width source: the whole image is the region (a resize reads
// across the crop's edges), the crop's preimage the box. Resizing the whole
// image then cropping gives the same pixels as resampling this area.
// kUsage unless the crop lies inside the resized image.
SourceArea resized_crop_area(int height, int width, Extent resized, const Window& crop);

}  // namespace chute

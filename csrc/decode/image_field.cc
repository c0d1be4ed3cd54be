#include "decode/image_field.h"

#include "core/random.h"

namespace chute {
namespace {

const std::string kNoWhere;  // the engine adds where the bytes are

DType row_dtype(PixelType type) {
  switch (type) {
    case PixelType::kUint8:
      return DType::kU8;
    case PixelType::kFloat32:
      return DType::kF32;
    case PixelType::kFloat16:
      return DType::kF16;
    case PixelType::kBFloat16:
      return DType::kU16;
  }
  return DType::kU8;
}

}  // namespace

ImageFieldDecoder::ImageFieldDecoder(ColorMode color, const ImageOutputSpec& spec,
                                     const std::string& field)
    : color_(color), spec_(spec) {
  check_output_spec(spec_, field);
  format_ = output_format(spec_);
  const bool hwc = spec_.layout == Layout::kHWC || color_ == ColorMode::kGray;
  plain_copy_ = !spec_.resizes() && hwc && spec_.dtype == PixelType::kUint8 &&
                !spec_.random_flip;
}

void ImageFieldDecoder::probe(const uint8_t* data, size_t size, ProbedField& out) const {
  const ImageInfo info = probe_image(data, size, kNoWhere);
  out.detail[0] = info.height;
  out.detail[1] = info.width;
  out.dtype = row_dtype(spec_.dtype);
  const int64_t h = spec_.resizes() ? spec_.out_height : info.height;
  const int64_t w = spec_.resizes() ? spec_.out_width : info.width;
  if (color_ == ColorMode::kGray) {
    if (spec_.squeeze_gray) {
      out.shape.assign({h, w});
    } else {
      out.shape.assign({h, w, 1});
    }
  } else if (spec_.layout == Layout::kCHW) {
    out.shape.assign({3, h, w});
  } else {
    out.shape.assign({h, w, 3});
  }
}

ImagePlacement ImageFieldDecoder::placement(int height, int width, const RowPosition& at) const {
  Rng rng(at.derive());
  return place_image(spec_, height, width, rng);
}

void ImageFieldDecoder::decode(const uint8_t* data, size_t size, const ProbedField& probed,
                               const RowPosition& at, uint8_t* out) const {
  if (plain_copy_) {
    decode_image(data, size, color_, out, kNoWhere);
    return;
  }
  const auto height = static_cast<int>(probed.detail[0]);
  const auto width = static_cast<int>(probed.detail[1]);
  const ImagePlacement p = placement(height, width, at);
  ResampleOutput target;
  target.height = spec_.resizes() ? spec_.out_height : height;
  target.width = spec_.resizes() ? spec_.out_width : width;
  target.flip = p.flip;
  target.format = &format_;
  target.data = out;
  // Without a resize every pixel is kept: the whole decode, bit for bit
  // Pillow's, streamed through the resampler's copy path (layout, type and
  // flip applied while each band of rows is in L1). With one, only the
  // crop is decoded, at the smallest DCT scale that still covers the output.
  const RegionDecode how = spec_.resizes() ? RegionDecode::kCropScaled : RegionDecode::kFull;
  decode_image_resampled(data, size, color_, p.area, target, how, kNoWhere);
}

}  // namespace chute

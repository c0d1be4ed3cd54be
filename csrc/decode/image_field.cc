#include "decode/image_field.h"

#include <vector>

#include "core/error.h"
#include "core/random.h"

namespace chute {
namespace {

const std::string kNoWhere;  // the engine adds where the bytes are

}  // namespace

ImageFieldDecoder::ImageFieldDecoder(ColorMode color, const ImageOutputSpec& spec,
                                     const std::string& field)
    : color_(color), spec_(spec) {
  CHUTE_CHECK(spec_.out_height <= 0 || spec_.out_width > 0, kUsage,
              "field '" << field << "': output size needs both height and width");
  spec_.channels = color_ == ColorMode::kGray ? 1 : 3;
  plain_copy_ = spec_.out_height == 0 && !spec_.chw && !spec_.to_float && !spec_.random_flip;
}

void ImageFieldDecoder::probe(const uint8_t* data, size_t size, ProbedField& out) const {
  const ImageInfo info = probe_image(data, size, kNoWhere);
  out.detail[0] = info.height;
  out.detail[1] = info.width;
  out.dtype = spec_.to_float ? DType::kF32 : DType::kU8;
  const int64_t h = spec_.out_height > 0 ? spec_.out_height : info.height;
  const int64_t w = spec_.out_width > 0 ? spec_.out_width : info.width;
  const int64_t c = spec_.channels;
  if (c == 1 && spec_.squeeze_gray) {
    out.shape.assign({h, w});
  } else if (spec_.chw) {
    out.shape.assign({c, h, w});
  } else {
    out.shape.assign({h, w, c});
  }
}

void ImageFieldDecoder::decode(const uint8_t* data, size_t size, const ProbedField& probed,
                               const RowPosition& at, uint8_t* out) const {
  if (plain_copy_) {
    decode_image(data, size, color_, out, kNoWhere);
    return;
  }
  const auto height = static_cast<int>(probed.detail[0]);
  const auto width = static_cast<int>(probed.detail[1]);
  const int c = spec_.channels;
  Rng rng(at.derive());
  if (spec_.out_height == 0) {
    // No resize: layout, dtype and flip happen row group by row group while
    // the decoder's rows are in L1, not in a second pass over a whole image.
    // (The window is the whole image; the rng draws only the flip, as below.)
    const bool flip = spec_.random_flip && (rng.next() & 1);
    ImageWriter writer(height, width, spec_, 0, 0, flip, out);
    decode_image_rows(data, size, color_, writer, kNoWhere);
    return;
  }
  thread_local std::vector<uint8_t> decoded;
  thread_local std::vector<uint8_t> resized;
  decoded.resize(static_cast<size_t>(height) * width * c);
  decode_image(data, size, color_, decoded.data(), kNoWhere);
  const uint8_t* src = decoded.data();
  int h = height;
  int w = width;
  if (spec_.out_height > 0) {
    const ImageSize target = resize_target(height, width, spec_);
    if (target.height != h || target.width != w) {
      resized.resize(static_cast<size_t>(target.height) * target.width * c);
      resize_bilinear(src, h, w, c, resized.data(), target.height, target.width);
      src = resized.data();
      h = target.height;
      w = target.width;
    }
  }
  int crop_y = 0;
  int crop_x = 0;
  if (spec_.crop == CropMode::kRandom && spec_.out_height > 0) {
    crop_y = static_cast<int>(rng.below(static_cast<uint64_t>(h - spec_.out_height) + 1));
    crop_x = static_cast<int>(rng.below(static_cast<uint64_t>(w - spec_.out_width) + 1));
  } else {
    center_crop_origin(h, w, spec_, &crop_y, &crop_x);
  }
  const bool flip = spec_.random_flip && (rng.next() & 1);
  write_image_output(src, h, w, spec_, crop_y, crop_x, flip, out);
}

}  // namespace chute

// Images (JPEG/PNG) as a field: one row per image, uint8 or float32, HWC or
// CHW, at the decoded size or resized and cropped to a fixed one, optionally
// flipped (see image/transform.h).
#pragma once

#include <string>

#include "decode/image_decoder.h"
#include "image/transform.h"
#include "pipeline/field_decoder.h"

namespace chute {

class ImageFieldDecoder final : public FieldDecoder {
 public:
  // Throws kUsage naming `field` for a spec that cannot work.
  ImageFieldDecoder(ColorMode color, const ImageOutputSpec& spec, const std::string& field);

  // detail: the decoded height and width.
  void probe(const uint8_t* data, size_t size, ProbedField& out) const override;
  void decode(const uint8_t* data, size_t size, const ProbedField& probed, const RowPosition& at,
              uint8_t* out) const override;

 private:
  ColorMode color_;
  ImageOutputSpec spec_;  // channels set from color_
  bool plain_copy_;       // the decoder's own output is the row
};

}  // namespace chute

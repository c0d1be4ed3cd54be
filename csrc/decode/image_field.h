// Images (the formats of image_decoder.h's table) as a field: one row per
// image, at the decoded size or resized and cropped to a fixed one,
// optionally flipped, in the spec's layout, element type and normalisation
// (see image/output_spec.h). The decoding thread writes each row straight
// into the batch: a resized image is decoded only where its crop lies, where
// its format can (a JPEG also at a reduced DCT scale where that still covers
// the output), its rows streamed through the resampler.
#pragma once

#include <string>

#include "decode/image_decoder.h"
#include "image/output_spec.h"
#include "image/pixel_format.h"
#include "sources/field_decoder.h"

namespace chute {

class ImageFieldDecoder final : public FieldDecoder {
 public:
  // Throws kUsage naming `field` for a spec that cannot work.
  ImageFieldDecoder(ColorMode color, const ImageOutputSpec& spec, const std::string& field);

  // detail: the decoded height and width. dtype: uint8, float32, float16, or
  // uint16 holding bfloat16 bits (numpy has no bfloat16; Python views them).
  void probe(const uint8_t* data, size_t size, ProbedField& out) const override;
  void decode(const uint8_t* data, size_t size, const ProbedField& probed, const RowPosition& at,
              uint8_t* out) const override;

  // What decode() reads of a height x width image for the row at `at`.
  ImagePlacement placement(int height, int width, const RowPosition& at) const;

 private:
  ColorMode color_;
  ImageOutputSpec spec_;
  OutputFormat format_;
  bool plain_copy_;  // the decoder's own output is the row
};

}  // namespace chute

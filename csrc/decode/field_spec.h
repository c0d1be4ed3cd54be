// How one field's member is to be decoded, as Python asks for it. compose/
// turns a spec into the FieldDecoder the engine runs.
#pragma once

#include <cstdint>

#include "decode/image_decoder.h"
#include "image/output_spec.h"

namespace chute {

enum class FieldCodec : uint8_t {
  kImage,  // an image → a row per `image` (image/output_spec.h)
  kNpy,    // .npy → its dtype and shape
  kInt,    // int(bytes) → int64
  kRaw,    // bytes handed to Python (the slow path decodes them there)
};

struct FieldCodecSpec {
  FieldCodec codec = FieldCodec::kRaw;
  ColorMode color = ColorMode::kRgb;  // images
  ImageOutputSpec image;              // images
};

}  // namespace chute

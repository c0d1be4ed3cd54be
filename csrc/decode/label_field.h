// Integer labels (`cls`, `index`, ...) as a field: one int64 per sample, the
// value read when the header is probed (see decode/label.h).
#pragma once

#include "sources/field_decoder.h"

namespace chute {

class LabelFieldDecoder final : public FieldDecoder {
 public:
  // detail: the value.
  void probe(const uint8_t* data, size_t size, ProbedField& out) const override;
  void decode(const uint8_t* data, size_t size, const ProbedField& probed, const RowPosition& at,
              uint8_t* out) const override;
};

}  // namespace chute

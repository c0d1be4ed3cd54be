// .npy members as a field: one row of the array's own dtype and shape.
#pragma once

#include "sources/field_decoder.h"

namespace chute {

class NpyFieldDecoder final : public FieldDecoder {
 public:
  // detail: the array bytes' offset in the payload, and flags (byte-swapped,
  // Fortran order).
  void probe(const uint8_t* data, size_t size, ProbedField& out) const override;
  void decode(const uint8_t* data, size_t size, const ProbedField& probed, const RowPosition& at,
              uint8_t* out) const override;
};

}  // namespace chute

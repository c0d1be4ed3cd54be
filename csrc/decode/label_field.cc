#include "decode/label_field.h"

#include <cstring>
#include <string>

#include "decode/label.h"

namespace chute {
namespace {

const std::string kNoWhere;  // the engine adds where the bytes are

}  // namespace

void LabelFieldDecoder::probe(const uint8_t* data, size_t size, ProbedField& out) const {
  out.detail[0] = parse_int_label(data, size, kNoWhere);
  out.dtype = DType::kI64;
  out.shape.clear();
}

void LabelFieldDecoder::decode(const uint8_t* /*data*/, size_t /*size*/, const ProbedField& probed,
                               const RowPosition& /*at*/, uint8_t* out) const {
  std::memcpy(out, &probed.detail[0], sizeof(int64_t));
}

}  // namespace chute

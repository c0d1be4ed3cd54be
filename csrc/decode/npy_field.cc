#include "decode/npy_field.h"

#include <string>

#include "decode/npy.h"

namespace chute {
namespace {

const std::string kNoWhere;  // the engine adds where the bytes are
constexpr int64_t kByteswap = 1;
constexpr int64_t kFortranOrder = 2;

}  // namespace

void NpyFieldDecoder::probe(const uint8_t* data, size_t size, ProbedField& out) const {
  NpyHeader header = parse_npy_header(data, size, kNoWhere);
  out.dtype = header.dtype;
  out.shape = std::move(header.shape);
  out.descr = std::move(header.descr);
  // An element only numpy names is a last axis of its bytes.
  if (!out.descr.empty()) out.shape.push_back(static_cast<int64_t>(header.itemsize));
  out.detail[0] = static_cast<int64_t>(header.data_offset);
  out.detail[1] = (header.byteswap ? kByteswap : 0) | (header.fortran_order ? kFortranOrder : 0);
}

void NpyFieldDecoder::decode(const uint8_t* data, size_t /*size*/, const ProbedField& probed,
                             const RowPosition& /*at*/, uint8_t* out) const {
  const bool swap = (probed.detail[1] & kByteswap) != 0;
  const bool fortran = (probed.detail[1] & kFortranOrder) != 0;
  if (probed.descr.empty()) {
    copy_npy_array(dtype_size(probed.dtype), swap, fortran, probed.shape, data + probed.detail[0],
                   out);
    return;
  }
  const std::vector<int64_t> shape(probed.shape.begin(), probed.shape.end() - 1);
  copy_npy_array(static_cast<size_t>(probed.shape.back()), swap, fortran, shape,
                 data + probed.detail[0], out);
}

}  // namespace chute

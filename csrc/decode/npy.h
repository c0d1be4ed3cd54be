// .npy parsing (format versions 1.0, 2.0, 3.0) for numeric dtypes, C or
// Fortran order, either byte order. Object arrays (pickles) are refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace chute {

struct NpyHeader {
  DType dtype;
  bool byteswap;          // stored in the other byte order; copy_npy swaps to native
  bool fortran_order;
  std::vector<int64_t> shape;
  size_t data_offset;     // where the array bytes start
  size_t data_bytes;      // product(shape) * itemsize
};

// Throws kData naming `where` for bad magic, header, dtype, shape overflow, or
// a payload shorter than the header promises.
NpyHeader parse_npy_header(const uint8_t* data, size_t size, const std::string& where);

// Copies the array to `out` in native byte order and C order.
void copy_npy(const NpyHeader& header, const uint8_t* data, uint8_t* out);
// The same from the header's parts: `payload` is where the array bytes start.
void copy_npy_array(DType dtype, bool byteswap, bool fortran_order,
                    const std::vector<int64_t>& shape, const uint8_t* payload, uint8_t* out);

}  // namespace chute

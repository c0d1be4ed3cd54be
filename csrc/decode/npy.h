// .npy parsing (format versions 1.0, 2.0, 3.0), C or Fortran order, either
// byte order, for every dtype np.load reads without pickles: the numeric
// ones the engine knows (DType, brought to this machine's byte order), and
// any other fixed-size one (complex, long double, structured records,
// datetime64/timedelta64, fixed-width bytes and str, void), whose elements
// are moved as bytes, in the file's byte order, and named for numpy by the
// header's own descr. Object arrays (pickles) are refused, as
// np.load(allow_pickle=False) refuses them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace chute {

struct NpyHeader {
  DType dtype;            // kU8 when only numpy can name the element (see descr)
  // Empty for a DType; else the descr's literal text as the header holds
  // it ("'<c8'", "[('t', '<M8[ns]'), ('v', '<f4')]"), which numpy turns into
  // the dtype with format.descr_to_dtype(ast.literal_eval(descr)).
  std::string descr;
  size_t itemsize;        // bytes per element
  bool byteswap;          // a DType in the other byte order; copy_npy swaps to native
  bool fortran_order;
  std::vector<int64_t> shape;
  size_t data_offset;     // where the array bytes start
  size_t data_bytes;      // product(shape) * itemsize
};

// Throws kData naming `where` for bad magic, header, dtype, shape overflow, or
// a payload shorter than the header promises.
NpyHeader parse_npy_header(const uint8_t* data, size_t size, const std::string& where);

// Copies the array to `out` in C order (a DType in native byte order).
void copy_npy(const NpyHeader& header, const uint8_t* data, uint8_t* out);
// The same from the header's parts: `payload` is where the array bytes start.
void copy_npy_array(size_t itemsize, bool byteswap, bool fortran_order,
                    const std::vector<int64_t>& shape, const uint8_t* payload, uint8_t* out);

}  // namespace chute

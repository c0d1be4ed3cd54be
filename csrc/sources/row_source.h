// A table of fixed-shape rows that can be gathered by index: the interface
// the indexed engine reads through (HDF5 datasets, in-memory arrays).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace chute {

class RowSource {
 public:
  virtual ~RowSource() = default;

  virtual DType dtype() const = 0;
  // numpy's name of the element type when DType has none (see
  // Tensor::descr): dtype() is then kU8 and row_shape() ends with the
  // element's bytes. Empty otherwise.
  virtual const std::string& element_descr() const {
    static const std::string kNone;
    return kNone;
  }
  // Dimensions after the first; empty for scalar rows.
  virtual const std::vector<int64_t>& row_shape() const = 0;
  virtual int64_t num_rows() const = 0;
  // For error messages and stats.
  virtual const std::string& name() const = 0;

  // Writes rows[0..n) into `out` as n C-contiguous rows. Called concurrently
  // from several engine threads, so implementations must be thread-safe.
  // Indices are already range-checked by the caller.
  virtual void read_rows(const int64_t* rows, size_t n, uint8_t* out) = 0;

  // Bytes taken from the underlying storage (file bytes for HDF5, row bytes
  // copied for memory); for stats.
  virtual uint64_t bytes_read() const { return 0; }

  size_t row_bytes() const {
    size_t n = dtype_size(dtype());
    for (int64_t d : row_shape()) n *= static_cast<size_t>(d);
    return n;
  }
};

}  // namespace chute

// Rows of memory owned by someone else (a numpy array, a torch tensor, a
// memory-mapped .npy). The owner must outlive the source; the bindings keep
// the Python object alive for as long as the source exists.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sources/row_source.h"

namespace chute {

class MemoryRowSource : public RowSource {
 public:
  // `row_stride` is the byte distance between consecutive rows; each row
  // itself must be C-contiguous. `owner` is released when the source dies.
  // `descr`: see RowSource::element_descr.
  MemoryRowSource(std::string name, const uint8_t* data, int64_t num_rows, int64_t row_stride,
                  DType dtype, std::vector<int64_t> row_shape, std::shared_ptr<void> owner,
                  std::string descr = "");

  DType dtype() const override { return dtype_; }
  const std::string& element_descr() const override { return descr_; }
  const std::vector<int64_t>& row_shape() const override { return row_shape_; }
  int64_t num_rows() const override { return num_rows_; }
  const std::string& name() const override { return name_; }
  void read_rows(const int64_t* rows, size_t n, uint8_t* out) override;
  uint64_t bytes_read() const override { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  std::string name_;
  const uint8_t* data_;
  int64_t num_rows_;
  int64_t row_stride_;
  DType dtype_;
  std::vector<int64_t> row_shape_;
  size_t row_bytes_;
  std::shared_ptr<void> owner_;
  std::string descr_;
  std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace chute

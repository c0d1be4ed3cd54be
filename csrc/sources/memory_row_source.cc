#include "sources/memory_row_source.h"

#include <cstring>

namespace chute {

MemoryRowSource::MemoryRowSource(std::string name, const uint8_t* data, int64_t num_rows,
                                 int64_t row_stride, DType dtype, std::vector<int64_t> row_shape,
                                 std::shared_ptr<void> owner, std::string descr)
    : name_(std::move(name)),
      data_(data),
      num_rows_(num_rows),
      row_stride_(row_stride),
      dtype_(dtype),
      row_shape_(std::move(row_shape)),
      owner_(std::move(owner)),
      descr_(std::move(descr)) {
  row_bytes_ = row_bytes();
}

void MemoryRowSource::read_rows(const int64_t* rows, size_t n, uint8_t* out) {
  const size_t rb = row_bytes_;
  // Specialised copies for the common tiny rows: memcpy with a constant size
  // compiles to a couple of moves, where a variable-size call costs more than
  // the copy itself.
  switch (rb) {
    case 4:
      for (size_t i = 0; i < n; ++i) std::memcpy(out + i * 4, data_ + rows[i] * row_stride_, 4);
      break;
    case 8:
      for (size_t i = 0; i < n; ++i) std::memcpy(out + i * 8, data_ + rows[i] * row_stride_, 8);
      break;
    default:
      for (size_t i = 0; i < n; ++i) std::memcpy(out + i * rb, data_ + rows[i] * row_stride_, rb);
  }
  bytes_read_.fetch_add(static_cast<uint64_t>(n * rb), std::memory_order_relaxed);
}

}  // namespace chute

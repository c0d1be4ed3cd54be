#include "tokens/token_field_source.h"

namespace chute {

TokenFieldSource::TokenFieldSource(std::shared_ptr<const TokenPacker> packer, TokenField field,
                                   std::string name)
    : packer_(std::move(packer)),
      field_(field),
      name_(std::move(name)),
      row_shape_{packer_->row_tokens(field)} {}

void TokenFieldSource::read_rows(const int64_t* rows, size_t n, uint8_t* out) {
  const size_t rb = row_bytes();
  packer_->write_rows(field_, rows, n, out);
  bytes_read_.fetch_add(n * rb, std::memory_order_relaxed);
}

}  // namespace chute

// One field of packed token sequences (input_ids, labels, position_ids, or
// the window of seq_len + 1 tokens they are both cut from)
// as rows the indexed engine gathers: row i is sequence i of the packer.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "sources/row_source.h"
#include "tokens/token_packer.h"

namespace chute {

class TokenFieldSource : public RowSource {
 public:
  TokenFieldSource(std::shared_ptr<const TokenPacker> packer, TokenField field, std::string name);

  DType dtype() const override { return packer_->options().out_dtype; }
  const std::vector<int64_t>& row_shape() const override { return row_shape_; }
  int64_t num_rows() const override { return packer_->num_sequences(); }
  const std::string& name() const override { return name_; }
  void read_rows(const int64_t* rows, size_t n, uint8_t* out) override;
  uint64_t bytes_read() const override { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<const TokenPacker> packer_;
  TokenField field_;
  std::string name_;
  std::vector<int64_t> row_shape_;
  std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace chute

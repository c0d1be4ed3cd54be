// What the engine hands to the consumer: one batch, column by column. A
// column is either one C-contiguous tensor [B, ...] written in place by the
// decoding thread (the fast path), a list of per-sample tensors (variable
// shapes), or per-sample raw bytes that Python decodes (the slow path).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "memory/batch_allocator.h"

namespace chute {

struct Tensor {
  std::shared_ptr<Block> block;  // keeps the memory alive
  size_t offset = 0;             // bytes into block
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;    // C-contiguous
  // Set when the elements are of a type only numpy names (ProbedField::descr):
  // dtype is then kU8 and the last axis of shape is one element's bytes.
  std::string descr;

  uint8_t* data() const { return block->data() + offset; }
  size_t numel() const;
  size_t nbytes() const { return numel() * dtype_size(dtype); }
};

// Allocates a tensor of the given shape from `allocator`.
Tensor make_tensor(BatchAllocator& allocator, DType dtype, std::vector<int64_t> shape);

enum class ColumnKind : uint8_t {
  kStacked,  // `stacked` holds [B, ...]
  kList,     // `items` holds one tensor per sample
  kBytes,    // `raw` holds each sample's undecoded bytes
};

struct Column {
  ColumnKind kind = ColumnKind::kStacked;
  Tensor stacked;
  std::vector<Tensor> items;
  std::vector<std::string> raw;
  // Per-sample presence for optional fields (dict-style samples); empty means
  // every sample has the field.
  std::vector<uint8_t> present;
};

struct Batch {
  int64_t sequence = 0;            // position in the epoch's batch order (delivery order)
  int64_t size = 0;                // rows
  std::vector<Column> columns;     // in the plan's field order
  std::vector<std::string> keys;   // __key__ of each row (streams) — empty for indexed sources
  std::vector<uint32_t> source_index;  // which shard/url each row came from
  // Per row, the members no field claimed, as (extension, bytes), when the
  // plan keeps them (dict-style samples).
  std::vector<std::vector<std::pair<std::string, std::string>>> other_members;

  // Removes the rows flagged in `dropped` (one flag per row), keeping the
  // others in order: the batch comes out shorter.
  void drop_rows(const std::vector<uint8_t>& dropped);
  // Bytes of its tensors (stacked and list columns).
  size_t tensor_bytes() const;
};

}  // namespace chute

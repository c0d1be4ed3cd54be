#include "pipeline/batch.h"

#include "core/error.h"

namespace chute {

size_t Tensor::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

Tensor make_tensor(BatchAllocator& allocator, DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  for (int64_t d : t.shape) CHUTE_CHECK(d >= 0, kUsage, "negative dimension " << d);
  t.block = allocator.allocate(t.nbytes());
  return t;
}

}  // namespace chute

#include "batching/batch.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <sstream>

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
  // A failed allocation names what it was for: the rows of which field is
  // not known here, but the shape says how large a batch asked for it.
  auto out_of_memory = [&](const std::string& why) {
    std::ostringstream shape;
    for (size_t i = 0; i < t.shape.size(); ++i) shape << (i ? ", " : "") << t.shape[i];
    CHUTE_CHECK(false, kMemory, "out of memory: cannot allocate " << t.nbytes() << " bytes for a "
                                    << dtype_name(dtype) << " tensor of shape (" << shape.str()
                                    << ")" << why);
  };
  try {
    t.block = allocator.allocate(t.nbytes());
  } catch (const std::bad_alloc&) {
    out_of_memory("");
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kMemory) throw;
    out_of_memory(" (" + e.message() + ")");
  }
  return t;
}

void Batch::drop_rows(const std::vector<uint8_t>& dropped) {
  const auto n = static_cast<size_t>(size);
  const size_t kept = n - static_cast<size_t>(std::count(dropped.begin(), dropped.end(), 1));
  if (kept == n) return;
  size_t w = 0;
  for (size_t r = 0; r < n; ++r) {
    if (dropped[r]) continue;
    if (w != r) {
      for (Column& c : columns) {
        if (c.kind == ColumnKind::kStacked) {
          const size_t rb = c.stacked.nbytes() / n;
          std::memmove(c.stacked.data() + w * rb, c.stacked.data() + r * rb, rb);
        } else if (c.kind == ColumnKind::kList) {
          c.items[w] = std::move(c.items[r]);
        } else {
          c.raw[w] = std::move(c.raw[r]);
        }
        if (!c.present.empty()) c.present[w] = c.present[r];
      }
      if (!keys.empty()) keys[w] = std::move(keys[r]);
      if (!source_index.empty()) source_index[w] = source_index[r];
      if (!other_members.empty()) other_members[w] = std::move(other_members[r]);
    }
    ++w;
  }
  for (Column& c : columns) {
    if (c.kind == ColumnKind::kStacked) c.stacked.shape[0] = static_cast<int64_t>(kept);
    c.items.resize(c.kind == ColumnKind::kList ? kept : 0);
    c.raw.resize(c.kind == ColumnKind::kBytes ? kept : 0);
    if (!c.present.empty()) c.present.resize(kept);
  }
  if (!keys.empty()) keys.resize(kept);
  if (!source_index.empty()) source_index.resize(kept);
  if (!other_members.empty()) other_members.resize(kept);
  size = static_cast<int64_t>(kept);
}

size_t Batch::tensor_bytes() const {
  size_t bytes = 0;
  for (const Column& c : columns) {
    if (c.kind == ColumnKind::kStacked) {
      bytes += c.stacked.nbytes();
    } else if (c.kind == ColumnKind::kList) {
      for (const Tensor& t : c.items) {
        if (t.block) bytes += t.nbytes();
      }
    }
  }
  return bytes;
}

}  // namespace chute

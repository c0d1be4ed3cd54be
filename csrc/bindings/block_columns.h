// Blocks of columns handed over from Python (Parquet row groups as pyarrow
// holds them): shared by the indexed block source and the stream's block feed,
// which hold the Python objects through keep_python_alive (engine_face.h).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "sources/block_sample_source.h"

namespace chute::bindings {

template <typename T>
using BlockArray = pybind11::array_t<T, pybind11::array::c_style | pybind11::array::forcecast>;

// One column of a block: a buffer (a pyarrow Buffer, held without a copy),
// int64 offsets (rows + 1) into it, and None or one uint8 per row (0 where
// the value is null).
using BlockColumnArgs =
    std::tuple<pybind11::buffer, BlockArray<int64_t>, std::optional<BlockArray<uint8_t>>>;

// The columns of a block of `rows` rows named `what`, pointing into the
// Python objects, which are appended to `held`.
inline std::vector<BlockColumn> block_columns(const std::vector<BlockColumnArgs>& columns,
                                              int64_t rows, const std::string& what,
                                              pybind11::list& held) {
  std::vector<BlockColumn> out;
  for (const auto& [data, offsets, present] : columns) {
    const pybind11::buffer_info info = data.request();
    CHUTE_CHECK(offsets.ndim() == 1 && offsets.size() == rows + 1, kUsage,
                what << " has " << rows << " rows: its offsets need " << rows + 1
                     << " entries, not " << offsets.size());
    BlockColumn c;
    c.data = static_cast<const uint8_t*>(info.ptr);
    c.data_size = static_cast<size_t>(info.size * info.itemsize);
    c.offsets = offsets.data();
    held.append(data);
    held.append(offsets);
    if (present) {
      CHUTE_CHECK(present->ndim() == 1 && present->size() == rows, kUsage,
                  what << " has " << rows << " rows, its null mask " << present->size());
      c.present = present->data();
      held.append(*present);
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace chute::bindings

// Element types the engine writes. Names follow numpy's dtype strings so the
// bindings can hand them over without a table on the Python side.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace chute {

enum class DType : uint8_t { kBool, kU8, kI8, kU16, kI16, kU32, kI32, kU64, kI64, kF16, kF32, kF64 };

size_t dtype_size(DType t);
// numpy's native-order type string: "uint8", "float32", ...
const char* dtype_name(DType t);
// Parses a numpy type code such as "<f4", "|u1", ">i8", "?" ; sets `swap` when
// the bytes are not in this machine's order. Returns false for anything else.
bool dtype_from_numpy_descr(const std::string& descr, DType* out, bool* swap);

}  // namespace chute

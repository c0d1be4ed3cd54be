#include "core/dtype.h"

namespace chute {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kBool:
    case DType::kU8:
    case DType::kI8:
      return 1;
    case DType::kU16:
    case DType::kI16:
    case DType::kF16:
      return 2;
    case DType::kU32:
    case DType::kI32:
    case DType::kF32:
      return 4;
    case DType::kU64:
    case DType::kI64:
    case DType::kF64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBool: return "bool";
    case DType::kU8: return "uint8";
    case DType::kI8: return "int8";
    case DType::kU16: return "uint16";
    case DType::kI16: return "int16";
    case DType::kU32: return "uint32";
    case DType::kI32: return "int32";
    case DType::kU64: return "uint64";
    case DType::kI64: return "int64";
    case DType::kF16: return "float16";
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
  }
  return "?";
}

bool dtype_from_numpy_descr(const std::string& descr, DType* out, bool* swap) {
  if (descr == "?" || descr == "|b1") {
    *out = DType::kBool;
    *swap = false;
    return true;
  }
  if (descr.size() != 3) return false;
  const char order = descr[0];
  const char kind = descr[1];
  const char width = descr[2];
  if (order != '<' && order != '>' && order != '|' && order != '=') return false;
  struct Entry {
    char kind, width;
    DType type;
  };
  static const Entry kTable[] = {
      {'u', '1', DType::kU8},  {'i', '1', DType::kI8},  {'u', '2', DType::kU16},
      {'i', '2', DType::kI16}, {'u', '4', DType::kU32}, {'i', '4', DType::kI32},
      {'u', '8', DType::kU64}, {'i', '8', DType::kI64}, {'f', '2', DType::kF16},
      {'f', '4', DType::kF32}, {'f', '8', DType::kF64}, {'b', '1', DType::kBool},
  };
  for (const Entry& e : kTable) {
    if (e.kind == kind && e.width == width) {
      *out = e.type;
      *swap = order == '>' && width != '1';
      return true;
    }
  }
  return false;
}

}  // namespace chute

// Image arguments from Python: the bytes of an encoded image, and its colour
// mode, as chute._core's decode functions and the chute_testing module take
// them.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "decode/image_decoder.h"

namespace chute::bindings {

// The bytes object stays referenced by the caller's argument for the whole
// call and is immutable, so its buffer is safe to read without the GIL.
struct Bytes {
  const uint8_t* data;
  size_t size;
};

inline Bytes view(const pybind11::bytes& b) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(b.ptr(), &data, &size) != 0) throw pybind11::error_already_set();
  return {reinterpret_cast<const uint8_t*>(data), static_cast<size_t>(size)};
}

inline ColorMode parse_mode(const std::string& mode) {
  if (mode == "rgb" || mode == "RGB") return ColorMode::kRgb;
  if (mode == "l" || mode == "L") return ColorMode::kGray;
  CHUTE_CHECK(false, kUsage, "image mode must be 'rgb' or 'l', not '" << mode << "'");
  return ColorMode::kRgb;
}

}  // namespace chute::bindings

// Integer labels as webdataset reads `cls`/`index`/... members: Python's
// int(bytes) — optional surrounding whitespace, optional sign, decimal digits
// (underscores between digits allowed, as Python does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace chute {

// Throws kData naming `where` when the bytes are not an integer or overflow int64.
int64_t parse_int_label(const uint8_t* data, size_t size, const std::string& where);

}  // namespace chute

// The HDF5 filters the engine undoes natively. Each throws chute::Error
// (kData) with `where` (file, dataset, chunk, byte offset) in the message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chute::h5 {

// zlib-inflates `in` into exactly `out_size` bytes.
void inflate_exact(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size,
                   const std::string& where);

// Undoes HDF5's shuffle: the writer stored byte k of every element together
// (all first bytes, then all second bytes, ...); trailing bytes that do not
// form a whole element were left in place.
void unshuffle(const uint8_t* in, size_t size, size_t elem_size, uint8_t* out);

// HDF5's Fletcher-32 over `data` (16-bit big-endian words, odd byte padded).
uint32_t fletcher32(const uint8_t* data, size_t size);

// Checks the 4-byte trailer the fletcher32 filter appended and returns the
// payload size (size - 4). Throws kData on mismatch.
size_t verify_fletcher32(const uint8_t* data, size_t size, const std::string& where);

}  // namespace chute::h5

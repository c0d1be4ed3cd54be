// CRC-32C (Castagnoli), the checksum of node-cache entries (object_cache.h).
// Chosen over zlib's crc32 because x86-64 computes it with one instruction
// per 8 bytes (SSE4.2), run here on three independent lanes whose results
// are combined; other machines use eight tables, eight bytes a step (see
// docs/remote.md for speeds).
#pragma once

#include <cstddef>
#include <cstdint>

namespace chute {

// Continues `crc` over `n` bytes: crc32c(crc32c(0, a), b) == crc32c(0, a + b).
// crc32c(0, "123456789", 9) == 0xE3069283.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);

// The same with tables only (what machines without SSE4.2 run; for tests).
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n);

}  // namespace chute

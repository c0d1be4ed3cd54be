#include "hdf5/h5_filters.h"

#include <zlib.h>

#include <climits>
#include <cstring>

#include "core/error.h"

namespace chute::h5 {

namespace {

// inflateEnd on every path out, including exceptions.
struct ZStream {
  z_stream s{};
  bool live = false;
  ~ZStream() {
    if (live) inflateEnd(&s);
  }
};

}  // namespace

void inflate_exact(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size,
                   const std::string& where) {
  CHUTE_CHECK(in_size <= UINT_MAX && out_size <= UINT_MAX, kData,
              where << ": chunk too large for zlib (" << in_size << " -> " << out_size
                    << " bytes)");
  ZStream z;
  CHUTE_CHECK(inflateInit(&z.s) == Z_OK, kData, where << ": zlib init failed");
  z.live = true;
  z.s.next_in = const_cast<Bytef*>(in);
  z.s.avail_in = static_cast<uInt>(in_size);
  z.s.next_out = out;
  z.s.avail_out = static_cast<uInt>(out_size);
  const int rc = inflate(&z.s, Z_FINISH);
  CHUTE_CHECK(rc == Z_STREAM_END, kData,
              where << ": deflate stream is corrupt (zlib: "
                    << (z.s.msg != nullptr ? z.s.msg : (rc == Z_BUF_ERROR ? "truncated or larger than the chunk" : "error"))
                    << ", after " << z.s.total_in << " input bytes)");
  CHUTE_CHECK(z.s.total_out == out_size, kData,
              where << ": chunk inflated to " << z.s.total_out << " bytes, expected " << out_size);
}

void unshuffle(const uint8_t* in, size_t size, size_t elem_size, uint8_t* out) {
  if (elem_size <= 1) {
    std::memcpy(out, in, size);
    return;
  }
  const size_t n = size / elem_size;
  for (size_t b = 0; b < elem_size; ++b) {
    const uint8_t* src = in + b * n;
    uint8_t* dst = out + b;
    for (size_t i = 0; i < n; ++i) dst[i * elem_size] = src[i];
  }
  const size_t tail = size - n * elem_size;
  if (tail != 0) std::memcpy(out + n * elem_size, in + n * elem_size, tail);
}

uint32_t fletcher32(const uint8_t* data, size_t size) {
  uint32_t sum1 = 0;
  uint32_t sum2 = 0;
  size_t words = size / 2;
  // Fold every 360 words so the 32-bit sums cannot overflow.
  while (words > 0) {
    size_t block = words > 360 ? 360 : words;
    words -= block;
    for (; block > 0; --block) {
      sum1 += (static_cast<uint32_t>(data[0]) << 8) | data[1];
      data += 2;
      sum2 += sum1;
    }
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  }
  if (size % 2 != 0) {
    sum1 += static_cast<uint32_t>(data[0]) << 8;
    sum2 += sum1;
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  }
  sum1 = (sum1 & 0xffff) + (sum1 >> 16);
  sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  return (sum2 << 16) | sum1;
}

size_t verify_fletcher32(const uint8_t* data, size_t size, const std::string& where) {
  CHUTE_CHECK(size >= 4, kData, where << ": chunk of " << size << " bytes has no fletcher32 trailer");
  const size_t payload = size - 4;
  const uint8_t* t = data + payload;
  // The trailer is stored little-endian; files from HDF5 1.6 stored it with
  // the 16-bit halves byte-swapped, which libhdf5 still accepts, and so do we.
  const uint32_t stored = static_cast<uint32_t>(t[0]) | (static_cast<uint32_t>(t[1]) << 8) |
                          (static_cast<uint32_t>(t[2]) << 16) | (static_cast<uint32_t>(t[3]) << 24);
  const uint32_t sum = fletcher32(data, payload);
  const uint32_t legacy = ((sum & 0x00ff00ffu) << 8) | ((sum >> 8) & 0x00ff00ffu);
  CHUTE_CHECK(stored == sum || stored == legacy, kData,
              where << ": fletcher32 checksum mismatch (stored " << stored << ", computed " << sum
                    << ")");
  return payload;
}

}  // namespace chute::h5

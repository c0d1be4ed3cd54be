#include "io/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define CHUTE_CRC32C_X86 1
#endif

namespace chute {
namespace {

// The reflected Castagnoli polynomial.
constexpr uint32_t kPoly = 0x82F63B78u;

// Updates below work on the register itself, without crc32c's initial and
// final inversion (the SSE4.2 instruction does the same).

// t[0] is the byte table; t[k][b] is byte b followed by k zero bytes, so
// that eight bytes are folded in with eight independent lookups.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t r = b;
      for (int k = 0; k < 8; ++k) r = (r >> 1) ^ ((r & 1u) ? kPoly : 0u);
      t[0][b] = r;
    }
    for (size_t k = 1; k < 8; ++k) {
      for (size_t b = 0; b < 256; ++b) {
        const uint32_t prev = t[k - 1][b];
        t[k][b] = (prev >> 8) ^ t[0][prev & 0xffu];
      }
    }
  }
};

const Tables& tables() {
  static const Tables tables;
  return tables;
}

uint32_t update_table(uint32_t reg, const uint8_t* p, size_t n) {
  const auto& t = tables().t;
  for (; n >= 8; p += 8, n -= 8) {
    const uint32_t lo = reg ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                               uint32_t{p[3]} << 24);
    reg = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^
          t[4][lo >> 24] ^ t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
  }
  for (; n > 0; ++p, --n) reg = t[0][(reg ^ *p) & 0xffu] ^ (reg >> 8);
  return reg;
}

#ifdef CHUTE_CRC32C_X86

// Bytes per lane of the three-lane loop. The instruction's latency is three
// times its throughput, so three independent lanes keep it busy; their
// registers are then joined by shifting over the later lanes' lengths.
constexpr size_t kLane = 4096;

// Shifting a register over kLane zero bytes is linear in its bits: four
// byte-indexed tables of the images of each byte position.
struct LaneShift {
  std::array<std::array<uint32_t, 256>, 4> t{};
  LaneShift() {
    static const uint8_t zeros[kLane] = {};
    uint32_t basis[32];
    for (int bit = 0; bit < 32; ++bit) basis[bit] = update_table(1u << bit, zeros, kLane);
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int j = 0; j < 8; ++j) {
          if (b & (1u << j)) v ^= basis[8 * k + j];
        }
        t[static_cast<size_t>(k)][b] = v;
      }
    }
  }
  uint32_t operator()(uint32_t reg) const {
    return t[0][reg & 0xffu] ^ t[1][(reg >> 8) & 0xffu] ^ t[2][(reg >> 16) & 0xffu] ^
           t[3][reg >> 24];
  }
};

const LaneShift& lane_shift() {
  static const LaneShift shift;
  return shift;
}

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// clang (the manylinux_2_28 toolchain) keeps the CRC32 instructions a feature
// of their own beside SSE4.2; GCC accepts both names.
__attribute__((target("sse4.2,crc32"))) uint32_t update_sse42(uint32_t reg, const uint8_t* p, size_t n) {
  const LaneShift& shift = lane_shift();
  while (n >= 3 * kLane) {
    uint64_t a = reg, b = 0, c = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      a = _mm_crc32_u64(a, load64(p + i));
      b = _mm_crc32_u64(b, load64(p + kLane + i));
      c = _mm_crc32_u64(c, load64(p + 2 * kLane + i));
    }
    reg = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(c);
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  uint64_t r = reg;
  for (; n >= 8; p += 8, n -= 8) r = _mm_crc32_u64(r, load64(p));
  reg = static_cast<uint32_t>(r);
  for (; n > 0; ++p, --n) reg = _mm_crc32_u8(reg, *p);
  return reg;
}

bool have_sse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}

#endif

}  // namespace

uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n) {
  return ~update_table(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
#ifdef CHUTE_CRC32C_X86
  if (have_sse42()) return ~update_sse42(~crc, static_cast<const uint8_t*>(data), n);
#endif
  return crc32c_portable(crc, data, n);
}

}  // namespace chute

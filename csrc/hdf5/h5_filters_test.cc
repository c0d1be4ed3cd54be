#include "hdf5/h5_filters.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"

namespace chute::h5 {
namespace {

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

TEST(Unshuffle, RegroupsTheBytesOfEachElement) {
  // Elements "ABCD", "EFGH", "IJKL" as the shuffle filter stores them: all
  // first bytes, then all second bytes, ...
  const std::vector<uint8_t> in = bytes("AEIBFJCGKDHL");
  std::vector<uint8_t> out(in.size());
  unshuffle(in.data(), in.size(), 4, out.data());
  EXPECT_EQ(std::string(out.begin(), out.end()), "ABCDEFGHIJKL");
}

TEST(Unshuffle, TrailingBytesStayInPlace) {
  // Two 4-byte elements (8 shuffled bytes) and 3 bytes that form no element.
  const std::vector<uint8_t> in = bytes("aAbBcCdDxyz");
  std::vector<uint8_t> out(in.size());
  unshuffle(in.data(), in.size(), 4, out.data());
  EXPECT_EQ(std::string(out.begin(), out.end()), "abcdABCDxyz");
}

TEST(Unshuffle, OneByteElementsAreCopied) {
  const std::vector<uint8_t> in = bytes("hello");
  std::vector<uint8_t> out(in.size());
  unshuffle(in.data(), in.size(), 1, out.data());
  EXPECT_EQ(out, in);
}

TEST(Fletcher32, MatchesTheReferenceValues) {
  // The published Fletcher-32 check values ("abcdef" -> 0x56502d2a,
  // "abcdefgh" -> 0xebe19591) are for little-endian 16-bit words; HDF5 reads
  // the words big-endian, so it gives those values for the byte-swapped text.
  const std::vector<uint8_t> a = bytes("badcfe");
  EXPECT_EQ(fletcher32(a.data(), a.size()), 0x56502d2au);
  const std::vector<uint8_t> b = bytes("badcfehg");
  EXPECT_EQ(fletcher32(b.data(), b.size()), 0xebe19591u);
}

TEST(Fletcher32, LongInputFoldsWithoutOverflow) {
  // 100 KiB of 0xff: the sums would overflow 32 bits without the periodic fold.
  // Each word is 0xffff == 0 mod 65535, so both sums are 0 mod 65535.
  const std::vector<uint8_t> ones(100 * 1024, 0xff);
  const uint32_t sum = fletcher32(ones.data(), ones.size());
  EXPECT_EQ((sum & 0xffff) % 65535, 0u);
  EXPECT_EQ((sum >> 16) % 65535, 0u);
  // An odd length pads the last byte as the high half of a word.
  const std::vector<uint8_t> odd = bytes("\x01\x02\x03");
  // words 0x0102, 0x0300: s1 = 0x0402, s2 = 0x0102 + 0x0402 = 0x0504
  EXPECT_EQ(fletcher32(odd.data(), odd.size()), 0x05040402u);
}

std::vector<uint8_t> with_trailer(std::vector<uint8_t> data, uint32_t trailer) {
  for (int i = 0; i < 4; ++i) data.push_back(static_cast<uint8_t>(trailer >> (8 * i)));
  return data;
}

TEST(Fletcher32, VerifyAcceptsTheTrailerAndItsLegacyByteOrder) {
  const std::vector<uint8_t> payload = bytes("badcfehg");
  const std::vector<uint8_t> chunk = with_trailer(payload, 0xebe19591u);
  EXPECT_EQ(verify_fletcher32(chunk.data(), chunk.size(), "here"), payload.size());
  // HDF5 1.6 wrote each 16-bit half byte-swapped.
  const std::vector<uint8_t> legacy = with_trailer(payload, 0xe1eb9195u);
  EXPECT_EQ(verify_fletcher32(legacy.data(), legacy.size(), "here"), payload.size());
}

TEST(Fletcher32, VerifyRefusesAMismatchOrAMissingTrailer) {
  const std::vector<uint8_t> chunk = with_trailer(bytes("badcfehg"), 0xebe19592u);
  std::optional<Error> e =
      test::error_from([&] { verify_fletcher32(chunk.data(), chunk.size(), "chunk 3"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(), "chunk 3: fletcher32 checksum mismatch (stored " +
                              std::to_string(0xebe19592u) + ", computed " +
                              std::to_string(0xebe19591u) + ")");
  const std::vector<uint8_t> tiny = bytes("abc");
  e = test::error_from([&] { verify_fletcher32(tiny.data(), tiny.size(), "chunk 4"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "chunk 4: chunk of 3 bytes has no fletcher32 trailer");
}

std::vector<uint8_t> deflated(const std::vector<uint8_t>& in) {
  uLongf size = compressBound(static_cast<uLong>(in.size()));
  std::vector<uint8_t> out(size);
  EXPECT_EQ(compress2(out.data(), &size, in.data(), static_cast<uLong>(in.size()), 9), Z_OK);
  out.resize(size);
  return out;
}

TEST(Inflate, ExactSize) {
  std::vector<uint8_t> original(5000);
  for (size_t i = 0; i < original.size(); ++i) original[i] = static_cast<uint8_t>(i * i);
  const std::vector<uint8_t> z = deflated(original);
  std::vector<uint8_t> out(original.size());
  inflate_exact(z.data(), z.size(), out.data(), out.size(), "c");
  EXPECT_EQ(out, original);
}

TEST(Inflate, SizeOtherThanTheChunkIsAnError) {
  const std::vector<uint8_t> original(100, 7);
  const std::vector<uint8_t> z = deflated(original);
  std::vector<uint8_t> out(200);
  std::optional<Error> e =
      test::error_from([&] { inflate_exact(z.data(), z.size(), out.data(), 200, "c"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(), "c: chunk inflated to 100 bytes, expected 200");
  e = test::error_from([&] { inflate_exact(z.data(), z.size(), out.data(), 50, "c"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message().rfind("c: deflate stream is corrupt (zlib: ", 0), 0u) << e->message();
}

TEST(Inflate, CorruptOrTruncatedStreamIsAnError) {
  std::vector<uint8_t> original(1000);
  for (size_t i = 0; i < original.size(); ++i) original[i] = static_cast<uint8_t>(i % 251);
  const std::vector<uint8_t> z = deflated(original);
  std::vector<uint8_t> out(original.size());
  std::optional<Error> e =
      test::error_from([&] { inflate_exact(z.data(), z.size() / 2, out.data(), out.size(), "c"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message().rfind("c: deflate stream is corrupt (zlib: ", 0), 0u) << e->message();
  const std::vector<uint8_t> garbage(64, 0xab);
  e = test::error_from([&] { inflate_exact(garbage.data(), garbage.size(), out.data(), out.size(), "c"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message().rfind("c: deflate stream is corrupt (zlib: ", 0), 0u) << e->message();
}

}  // namespace
}  // namespace chute::h5

#include "tar/tar_stream.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "tar/archive_testing.h"

namespace chute {
namespace {

using test::end_blocks;
using test::error_from;
using test::extension;
using test::file;
using test::Header;
using test::header_block;
using test::Magic;
using test::MemorySource;
using test::pad;
using test::pax_record;

// The smallest buffer TarStream accepts: payloads of 1 KiB and more then take
// the direct path that reads straight into the caller's vector.
constexpr size_t kSmallBuffer = 2048;

struct Got {
  std::string name;
  uint64_t header_offset;
  uint64_t data_offset;
  uint64_t size;
  std::string payload;
  bool operator==(const Got& o) const {
    return name == o.name && header_offset == o.header_offset && data_offset == o.data_offset &&
           size == o.size && payload == o.payload;
  }
};

void PrintTo(const Got& g, std::ostream* os) {
  *os << "{'" << g.name << "' header@" << g.header_offset << " data@" << g.data_offset << " size "
      << g.size << " payload " << g.payload.size() << " bytes}";
}

// Every member with its payload (read with read_payload, or skipped by next()
// when `read` is false, which leaves the payload empty).
std::vector<Got> read_all(TarStream& tar, bool read = true) {
  std::vector<Got> out;
  TarMember m;
  while (tar.next(m)) {
    Got g{m.name, m.header_offset, m.data_offset, m.size, ""};
    if (read) {
      std::vector<uint8_t> bytes;
      tar.read_payload(bytes);
      g.payload.assign(bytes.begin(), bytes.end());
    }
    out.push_back(g);
  }
  return out;
}

std::vector<Got> read_all(const std::string& archive, bool read = true) {
  TarStream tar(std::make_unique<MemorySource>(archive));
  return read_all(tar, read);
}

// The message of the kData error that reading `archive` to its end raises.
std::string data_error(const std::string& archive, size_t buffer = size_t{1} << 20) {
  TarStream tar(std::make_unique<MemorySource>(archive), buffer);
  const std::optional<Error> e = error_from([&] { read_all(tar); });
  if (!e) return "<no error>";
  EXPECT_EQ(e->kind(), ErrorKind::kData) << e->what();
  return e->message();
}

std::string bytes_of(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

// An archive that uses every header form the parser knows, and what it must
// yield (offsets worked out by hand: each header is 512 bytes, each payload
// is padded to 512).
struct Mixed {
  std::string archive;
  std::vector<Got> members;
};

Mixed mixed_archive() {
  Mixed m;
  std::string& a = m.archive;
  const std::string big = bytes_of(3000, 'a');  // larger than half of kSmallBuffer
  const std::string long_name = "deep/" + std::string(150, 'n') + ".jpg";
  a += file("a.txt", "hello");                                        // 0: header, 512: data
  m.members.push_back({"a.txt", 0, 512, 5, "hello"});
  a += file("dir/b.bin", bytes_of(512, 'b'));                         // 1024, 1536
  m.members.push_back({"dir/b.bin", 1024, 1536, 512, bytes_of(512, 'b')});
  a += file("c.empty", "");                                           // 2048, 2560 (no data)
  m.members.push_back({"c.empty", 2048, 2560, 0, ""});
  a += file("d.big", big);                                            // 2560, 3072 .. 6144
  m.members.push_back({"d.big", 2560, 3072, 3000, big});
  a += extension('L', long_name + '\0');                              // 6144 (+512 payload)
  a += file(long_name.substr(0, 100), "L");                           // 7168, 7680
  m.members.push_back({long_name, 6144, 7680, 1, "L"});
  a += extension('x', pax_record("path", "pax/named.cls") + pax_record("mtime", "1.5"));  // 8192
  a += file("ignored-by-pax", "7");                                   // 9216, 9728
  m.members.push_back({"pax/named.cls", 8192, 9728, 1, "7"});
  Header prefixed;
  prefixed.name = "e.npy";
  prefixed.prefix = "some/prefix";
  a += test::member(prefixed, "np");                                  // 10240, 10752
  m.members.push_back({"some/prefix/e.npy", 10240, 10752, 2, "np"});
  a += end_blocks();                                                  // 11264
  return m;
}

TEST(TarStream, MixedArchiveMembersOffsetsAndPayloads) {
  const Mixed m = mixed_archive();
  ASSERT_EQ(m.archive.size(), 11264u + 1024u);
  EXPECT_EQ(read_all(m.archive), m.members);
}

// The same archive, whatever sizes the source's reads come in and whatever
// buffer the stream uses: every header, record and payload boundary then
// falls inside a read somewhere.
class TarStreamReads : public ::testing::TestWithParam<std::tuple<size_t, size_t>> {};

TEST_P(TarStreamReads, SameMembersWhateverTheReadSizes) {
  const auto [max_read, buffer] = GetParam();
  const Mixed m = mixed_archive();
  auto source = std::make_unique<MemorySource>(m.archive, max_read);
  auto log = source->log();
  TarStream tar(std::move(source), buffer);
  EXPECT_EQ(read_all(tar), m.members);
  EXPECT_EQ(log->bytes_read, m.archive.size());
  EXPECT_EQ(log->completes, 1);
}

INSTANTIATE_TEST_SUITE_P(ReadAndBufferSizes, TarStreamReads,
                         ::testing::Combine(::testing::Values(size_t{1}, size_t{3}, size_t{511},
                                                              size_t{512}, size_t{4096},
                                                              size_t{1} << 30),
                                            ::testing::Values(kSmallBuffer, size_t{1} << 20)));

TEST(TarStream, NextSkipsUnreadPayloads) {
  const Mixed m = mixed_archive();
  std::vector<Got> expected = m.members;
  for (Got& g : expected) g.payload.clear();
  for (size_t buffer : {kSmallBuffer, size_t{1} << 20}) {
    TarStream tar(std::make_unique<MemorySource>(m.archive, 100), buffer);
    EXPECT_EQ(read_all(tar, /*read=*/false), expected);
  }
}

TEST(TarStream, UstarPrefixJoinsTheName) {
  Header h;
  h.name = "name.txt";
  h.prefix = "a/b";
  EXPECT_EQ(read_all(test::member(h, "x") + end_blocks()),
            (std::vector<Got>{{"a/b/name.txt", 0, 512, 1, "x"}}));
}

TEST(TarStream, GnuHeaderHasNoPrefixField) {
  // Old GNU headers keep access and change times where ustar keeps the
  // prefix; header_block writes an atime there, which must not become a path.
  Header h;
  h.name = "plain.txt";
  h.magic = Magic::kGnu;
  EXPECT_EQ(read_all(test::member(h, "abc") + end_blocks()),
            (std::vector<Got>{{"plain.txt", 0, 512, 3, "abc"}}));
}

TEST(TarStream, PreUstarHeaderWithoutMagic) {
  Header h;
  h.name = "v7.txt";
  h.magic = Magic::kNone;
  h.type = '\0';  // a V7 regular file
  EXPECT_EQ(read_all(test::member(h, "old") + end_blocks()),
            (std::vector<Got>{{"v7.txt", 0, 512, 3, "old"}}));
}

TEST(TarStream, GnuLongNameAppliesToTheNextMemberOnly) {
  const std::string long_name = std::string(300, 'x') + ".png";
  // tar stores the name NUL-terminated; bytes after the NUL are not part of it.
  const std::string archive = extension('L', long_name + '\0' + "junk") +
                              file(long_name.substr(0, 100), "one") + file("short.png", "two") +
                              end_blocks();
  // L header at 0, its 309-byte payload at 512, the member header at 1024.
  EXPECT_EQ(read_all(archive), (std::vector<Got>{{long_name, 0, 1536, 3, "one"},
                                                 {"short.png", 2048, 2560, 3, "two"}}));
}

TEST(TarStream, GnuLongNameLargerThanTheBuffer) {
  // The record does not fit in the stream's buffer and is read in pieces.
  const std::string long_name = "d/" + std::string(2999, 'y') + ".bin";
  const std::string archive =
      extension('L', long_name + '\0') + file("trunc", "z") + end_blocks();
  TarStream tar(std::make_unique<MemorySource>(archive, 700), kSmallBuffer);
  // L header at 0, its 3006-byte payload padded to 3072, the member at 3584.
  EXPECT_EQ(read_all(tar), (std::vector<Got>{{long_name, 0, 4096, 1, "z"}}));
}

TEST(TarStream, GnuLongLinkBelongsToTheLinkWhichIsSkipped) {
  Header link;
  link.name = "a.lnk";
  link.type = '2';
  const std::string archive = extension('K', std::string(200, 't') + '\0') +
                              header_block(link) + file("real.txt", "r") + end_blocks();
  // K header 0, its payload 512, the link header 1024, the file at 1536.
  EXPECT_EQ(read_all(archive), (std::vector<Got>{{"real.txt", 1536, 2048, 1, "r"}}));
}

TEST(TarStream, PaxPathAndSizeOverrideTheNextMemberOnly) {
  // A size the 12-byte field cannot hold goes into the PAX record; the field
  // itself then says something else (here 0).
  Header h;
  h.name = "short";
  h.raw_size = test::octal(0, 11);
  const std::string payload = bytes_of(700, 'p');
  const std::string archive =
      extension('x', pax_record("path", "long/pax/name.seg.png") + pax_record("size", "700")) +
      header_block(h) + pad(payload) + file("after.txt", "a") + end_blocks();
  EXPECT_EQ(read_all(archive),
            (std::vector<Got>{{"long/pax/name.seg.png", 0, 1536, 700, payload},
                              {"after.txt", 2560, 3072, 1, "a"}}));
}

TEST(TarStream, PaxPathLosesTrailingSlashes) {
  const std::string archive = extension('x', pax_record("path", "dir/f.txt//")) +
                              file("f", "1") + end_blocks();
  EXPECT_EQ(read_all(archive), (std::vector<Got>{{"dir/f.txt", 0, 1536, 1, "1"}}));
}

TEST(TarStream, PaxGlobalRecordsApplyToEveryLaterMember) {
  // A `g` header is not part of the member after it (its offset is the
  // member's own), and its path applies until a local `x` path overrides it.
  const std::string archive = extension('g', pax_record("comment", "made by hand")) +
                              file("one.txt", "1") +
                              extension('g', pax_record("path", "global.txt")) +
                              file("two.txt", "2") +
                              extension('x', pax_record("path", "local.txt")) +
                              file("three.txt", "3") + file("four.txt", "4") + end_blocks();
  EXPECT_EQ(read_all(archive), (std::vector<Got>{{"one.txt", 1024, 1536, 1, "1"},
                                                 {"global.txt", 3072, 3584, 1, "2"},
                                                 {"local.txt", 4096, 5632, 1, "3"},
                                                 {"global.txt", 6144, 6656, 1, "4"}}));
}

TEST(TarStream, MalformedPaxRecordsAreErrors) {
  const std::string tail = file("f.txt", "x") + end_blocks();
  // A length longer than the record.
  EXPECT_EQ(data_error(extension('x', "99 path=a\n") + tail),
            "tar archive 'mem.tar': malformed PAX record in the header at offset 0 (record at byte 0)");
  // A good record, then one whose length does not end at its newline.
  EXPECT_EQ(data_error(extension('x', pax_record("path", "a.txt") + "12 path=ab\n") + tail),
            "tar archive 'mem.tar': malformed PAX record in the header at offset 0 (record at byte 14)");
  // No '=' in the record.
  EXPECT_EQ(data_error(file("first.txt", "") + extension('x', "9 pathxy\n") + tail),
            "tar archive 'mem.tar': malformed PAX record in the header at offset 512 (record at byte 0)");
  // No length.
  EXPECT_EQ(data_error(extension('g', "path=a\n") + tail),
            "tar archive 'mem.tar': malformed PAX record in the header at offset 0 (record at byte 0)");
}

TEST(TarStream, BadPaxSizeIsAnError) {
  EXPECT_EQ(data_error(extension('x', pax_record("size", "12x")) + file("f", "") + end_blocks()),
            "tar archive 'mem.tar': bad PAX size '12x' in the header at offset 0");
  EXPECT_EQ(data_error(extension('x', pax_record("size", "")) + file("f", "") + end_blocks()),
            "tar archive 'mem.tar': bad PAX size '' in the header at offset 0");
}

// A sparse file as tarfile reads it: each stored region at its offset,
// zeros everywhere else.
std::string expanded(uint64_t real_size, const std::vector<std::pair<uint64_t, std::string>>& regions) {
  std::string out(real_size, '\0');
  for (const auto& [offset, bytes] : regions) out.replace(offset, bytes.size(), bytes);
  return out;
}

TEST(TarStream, OldGnuSparseFilesAreExpandedWithTheirExtensionBlocks) {
  // 30 regions: four in the header, 21 in a first extension block, five in a second.
  std::vector<std::pair<uint64_t, uint64_t>> regions;
  std::vector<std::pair<uint64_t, std::string>> placed;
  std::string stored;
  for (int i = 0; i < 30; ++i) {
    const std::string bytes = bytes_of(10 + i, static_cast<char>('a' + i));
    regions.emplace_back(1000 * i + 100, bytes.size());
    placed.emplace_back(1000 * i + 100, bytes);
    stored += bytes;
  }
  ASSERT_EQ(stored.size(), 735u);  // two blocks of data
  const std::string archive = file("a.txt", "a") +
                              test::old_gnu_sparse("holes.bin", 31000, regions, stored) +
                              file("b.txt", "b") + end_blocks();
  // holes.bin: header at 1024, extension blocks at 1536 and 2048, data at 2560.
  const std::vector<Got> expected{{"a.txt", 0, 512, 1, "a"},
                                  {"holes.bin", 1024, 2560, 31000, expanded(31000, placed)},
                                  {"b.txt", 3584, 4096, 1, "b"}};
  EXPECT_EQ(read_all(archive), expected);
  for (size_t max_read : {size_t{1}, size_t{700}}) {
    TarStream tar(std::make_unique<MemorySource>(archive, max_read), kSmallBuffer);
    EXPECT_EQ(read_all(tar), expected);
    TarStream skipping(std::make_unique<MemorySource>(archive, max_read), kSmallBuffer);
    std::vector<Got> unread = expected;
    for (Got& g : unread) g.payload.clear();
    EXPECT_EQ(read_all(skipping, /*read=*/false), unread);
  }
}

TEST(TarStream, OldGnuSparseFileOfOnlyAHole) {
  // GNU tar marks the end of such a file with an empty region at its size.
  EXPECT_EQ(read_all(test::old_gnu_sparse("zeros.bin", 3000, {{3000, 0}}, "") + end_blocks()),
            (std::vector<Got>{{"zeros.bin", 0, 512, 3000, std::string(3000, '\0')}}));
}

TEST(TarStream, PaxSparseFormats) {
  const std::string want = expanded(5000, {{10, "abc"}, {4000, "de"}});
  // 0.0: repeated offset/numbytes records.
  const std::string v00 = extension('x', pax_record("GNU.sparse.size", "5000") +
                                             pax_record("GNU.sparse.offset", "10") +
                                             pax_record("GNU.sparse.numbytes", "3") +
                                             pax_record("GNU.sparse.offset", "4000") +
                                             pax_record("GNU.sparse.numbytes", "2") +
                                             pax_record("GNU.sparse.name", "real.bin")) +
                          file("GNUSparseFile.0/real.bin", "abcde");
  // 0.1: the map in one record.
  const std::string v01 = extension('x', pax_record("GNU.sparse.size", "5000") +
                                             pax_record("GNU.sparse.map", "10,3,4000,2") +
                                             pax_record("GNU.sparse.name", "real.bin")) +
                          file("GNUSparseFile.0/real.bin", "abcde");
  // 1.0: the map opens the payload, padded to a block.
  const std::string v10 = extension('x', pax_record("GNU.sparse.major", "1") +
                                             pax_record("GNU.sparse.minor", "0") +
                                             pax_record("GNU.sparse.name", "real.bin") +
                                             pax_record("GNU.sparse.realsize", "5000")) +
                          file("GNUSparseFile.0/real.bin", pad("2\n10\n3\n4000\n2\n") + "abcde");
  EXPECT_EQ(read_all(v00 + file("n.txt", "n") + end_blocks()),
            (std::vector<Got>{{"real.bin", 0, 1536, 5000, want}, {"n.txt", 2048, 2560, 1, "n"}}));
  EXPECT_EQ(read_all(v01 + file("n.txt", "n") + end_blocks()),
            (std::vector<Got>{{"real.bin", 0, 1536, 5000, want}, {"n.txt", 2048, 2560, 1, "n"}}));
  EXPECT_EQ(read_all(v10 + file("n.txt", "n") + end_blocks()),
            (std::vector<Got>{{"real.bin", 0, 2048, 5000, want}, {"n.txt", 2560, 3072, 1, "n"}}));
  for (size_t max_read : {size_t{1}, size_t{513}}) {
    TarStream tar(std::make_unique<MemorySource>(v10 + end_blocks(), max_read), kSmallBuffer);
    EXPECT_EQ(read_all(tar), (std::vector<Got>{{"real.bin", 0, 2048, 5000, want}}));
  }
}

// Each archive: a sparse member whose map is wrong, then a plain one. The
// sparse member comes out with a fault (its header is sound), its payload
// unread, and the stream goes on with the next member.
TEST(TarStream, MalformedSparseMapsAreFaultsAndTheStreamGoesOn) {
  auto sparse_01 = [](const std::string& size, const std::string& map) {
    return extension('x', pax_record("GNU.sparse.size", size) + pax_record("GNU.sparse.map", map)) +
           file("s.bin", "abcde");
  };
  const std::vector<std::pair<std::string, std::string>> cases{
      {sparse_01("5000", "4000,2,10,3"),
       "its GNU sparse map has a region (offset 10, 3 bytes) out of order or past the file's 5000 "
       "bytes"},
      {sparse_01("5000", "10,3,4999,2"),
       "its GNU sparse map has a region (offset 4999, 2 bytes) out of order or past the file's "
       "5000 bytes"},
      {sparse_01("5000", "10,30"), "its GNU sparse map covers 30 bytes but 5 are stored"},
      {sparse_01("5000", "10,x"), "bad GNU.sparse.map '10,x'"},
      {sparse_01("5000x", "10,3"), "bad GNU.sparse.size value '5000x'"},
      {sparse_01("99999999999", "10,3"),
       "it is a GNU sparse file of 99999999999 bytes; refusing to expand more than 4294967296"},
      {extension('x', pax_record("GNU.sparse.map", "10,3")) + file("s.bin", "abc"),
       "GNU sparse member without an expanded size"},
      {extension('x', pax_record("GNU.sparse.major", "1") + pax_record("GNU.sparse.minor", "0") +
                          pax_record("GNU.sparse.realsize", "100")) +
           file("s.bin", pad("1\n1x\n2\n") + "ab"),
       "bad number in its GNU sparse map (format 1.0)"},
      {extension('x', pax_record("GNU.sparse.major", "1") + pax_record("GNU.sparse.minor", "0") +
                          pax_record("GNU.sparse.realsize", "100")) +
           file("s.bin", "3\n1\n"),
       "its GNU sparse map (format 1.0) runs past its data"},
      {test::old_gnu_sparse("s.bin", 100, {{50, 10}, {40, 5}}, bytes_of(15, 'q')),
       "its GNU sparse map has a region (offset 40, 5 bytes) out of order or past the file's 100 "
       "bytes"},
  };
  for (const auto& [bad, fault] : cases) {
    for (size_t max_read : {size_t{1}, size_t{1} << 20}) {
      TarStream tar(std::make_unique<MemorySource>(bad + file("n.txt", "n") + end_blocks(), max_read),
                    kSmallBuffer);
      TarMember m;
      ASSERT_TRUE(tar.next(m));
      EXPECT_EQ(m.name, "s.bin");
      EXPECT_EQ(m.fault, fault);
      std::vector<uint8_t> ignored;
      const std::optional<Error> e = error_from([&] { tar.read_payload(ignored); });
      ASSERT_TRUE(e);
      EXPECT_EQ(e->kind(), ErrorKind::kUsage);
      ASSERT_TRUE(tar.next(m));
      EXPECT_EQ(m.name, "n.txt");
      EXPECT_EQ(m.fault, "");
      std::vector<uint8_t> payload;
      tar.read_payload(payload);
      EXPECT_EQ(std::string(payload.begin(), payload.end()), "n");
      EXPECT_FALSE(tar.next(m));
    }
  }
}

TEST(TarStream, TruncatedInsideASparseMap) {
  const std::string archive =
      test::old_gnu_sparse("s.bin", 100000, std::vector<std::pair<uint64_t, uint64_t>>(10, {0, 0}),
                           "");
  EXPECT_EQ(data_error(archive.substr(0, 512)),
            "truncated tar archive 'mem.tar': the stream ends at offset 512 inside the sparse map of "
            "member 's.bin' (header at offset 0, 0 bytes declared)");
}

TEST(TarStream, Base256SizeField) {
  Header h;
  h.name = "b256.bin";
  // 0x80, then the size big-endian in the remaining 11 bytes: 0x02bc = 700.
  h.raw_size = std::string("\x80\0\0\0\0\0\0\0\0\0\x02\xbc", 12);
  const std::string payload = bytes_of(700, 'q');
  EXPECT_EQ(read_all(header_block(h) + pad(payload) + end_blocks()),
            (std::vector<Got>{{"b256.bin", 0, 512, 700, payload}}));
}

TEST(TarStream, SpaceAndNulPaddedOctalSizes) {
  for (const std::string& raw : {std::string("        12 \0", 12), std::string("12\0\0\0\0\0\0\0\0\0\0", 12),
                                std::string("000000000012", 12)}) {
    Header h;
    h.name = "n.txt";
    h.raw_size = raw;
    EXPECT_EQ(read_all(header_block(h) + pad("0123456789") + end_blocks()),
              (std::vector<Got>{{"n.txt", 0, 512, 10, "0123456789"}}));
  }
}

TEST(TarStream, BadSizeFieldsAreErrors) {
  for (const std::string& raw : {std::string("0000000001a\0", 12), std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xfe", 12),
                                std::string("\x80\xff\0\0\0\0\0\0\0\0\0\0", 12)}) {
    Header h;
    h.name = "n.txt";
    h.raw_size = raw;
    EXPECT_EQ(data_error(file("ok.txt", "") + header_block(h) + end_blocks()),
              "tar archive 'mem.tar': bad size field in the header at offset 512");
  }
}

TEST(TarStream, BadChecksumIsAnErrorNamingTheOffset) {
  Header bad;
  bad.name = "b.txt";
  bad.corrupt_checksum = true;
  EXPECT_EQ(data_error(test::member(bad, "b") + end_blocks()),
            "bad header checksum in tar archive 'mem.tar' at offset 0 (not a tar archive?)");
  EXPECT_EQ(data_error(file("a.txt", "a") + test::member(bad, "b") + end_blocks()),
            "bad header checksum in tar archive 'mem.tar' at offset 1024");
  EXPECT_EQ(data_error(std::string(512, 'G')),
            "bad header checksum in tar archive 'mem.tar' at offset 0 (not a tar archive?)");
}

TEST(TarStream, SignedChecksumOfOldTarsIsAccepted) {
  Header h;
  h.name = "caf\xc3\xa9.txt";  // bytes >= 0x80 make the signed and unsigned sums differ
  h.signed_checksum = true;
  EXPECT_EQ(read_all(test::member(h, "s") + end_blocks()),
            (std::vector<Got>{{"caf\xc3\xa9.txt", 0, 512, 1, "s"}}));
}

TEST(TarStream, TruncatedInsideAHeader) {
  const std::string archive = file("a.txt", "a") + header_block(test::header("b.txt", 1)).substr(0, 100);
  EXPECT_EQ(data_error(archive),
            "truncated tar archive 'mem.tar': the stream ends inside the header at offset 1024 "
            "(100 of 512 bytes)");
  EXPECT_EQ(data_error(std::string(300, '\0')),
            "truncated tar archive 'mem.tar': the stream ends inside the header at offset 0 "
            "(300 of 512 bytes)");
}

TEST(TarStream, TruncatedInsideAPayload) {
  Header h;
  h.name = "a.txt";
  h.size = 1000;
  const std::string archive = header_block(h) + bytes_of(300, 'x');
  const std::string expected =
      "truncated tar archive 'mem.tar': the stream ends at offset 812 inside the data of member "
      "'a.txt' (header at offset 0, 1000 bytes declared)";
  EXPECT_EQ(data_error(archive), expected);  // read_payload
  for (size_t max_read : {size_t{64}, size_t{1} << 20}) {  // next() skipping the payload
    TarStream tar(std::make_unique<MemorySource>(archive, max_read), kSmallBuffer);
    const std::optional<Error> e = error_from([&] { read_all(tar, /*read=*/false); });
    ASSERT_TRUE(e);
    EXPECT_EQ(e->message(), expected);
  }
}

TEST(TarStream, TruncatedInsideALargePayloadOnTheDirectPath) {
  Header h;
  h.name = "big.bin";
  h.size = 100000;
  const std::string archive = header_block(h) + bytes_of(5000, 'x');
  EXPECT_EQ(data_error(archive, kSmallBuffer),
            "truncated tar archive 'mem.tar': the stream ends at offset 5512 inside the data of "
            "member 'big.bin' (header at offset 0, 100000 bytes declared)");
}

TEST(TarStream, TruncatedInsideThePadding) {
  const std::string archive = header_block(test::header("a.txt", 5)) + "hello" + std::string(100, '\0');
  EXPECT_EQ(data_error(archive),
            "truncated tar archive 'mem.tar': the stream ends at offset 617 inside the padding of "
            "member 'a.txt' (header at offset 0, 5 bytes declared)");
}

TEST(TarStream, TruncatedAfterAnExtensionHeader) {
  EXPECT_EQ(data_error(extension('x', pax_record("path", "p.txt"))),
            "truncated tar archive 'mem.tar': the stream ends at offset 1024 after the extension "
            "header at offset 0, before its member's header");
  EXPECT_EQ(data_error(file("a", "") + extension('L', "long.txt") + extension('x', pax_record("size", "1"))),
            "truncated tar archive 'mem.tar': the stream ends at offset 2560 after the extension "
            "header at offset 512, before its member's header");
}

TEST(TarStream, EndOfArchiveRightAfterAnExtensionHeader) {
  EXPECT_EQ(data_error(extension('L', "l.txt") + end_blocks()),
            "tar archive 'mem.tar': end-of-archive block at offset 1024 right after the extension "
            "header at offset 0");
}

TEST(TarStream, EmptySourceIsNotATarArchive) {
  EXPECT_EQ(data_error(""), "'mem.tar' is empty (0 bytes at offset 0): not a tar archive");
}

TEST(TarStream, TwoZeroBlocksEndTheArchiveAndTheRestIsDrained) {
  // What follows the end-of-archive blocks (tar pads archives to a record
  // size; some writers append more) is read to the end but never parsed.
  const std::string archive =
      file("a.txt", "a") + end_blocks() + file("after.txt", "z") + std::string(4096, '\0');
  auto source = std::make_unique<MemorySource>(archive, 1000);
  auto log = source->log();
  TarStream tar(std::move(source), kSmallBuffer);
  EXPECT_EQ(read_all(tar), (std::vector<Got>{{"a.txt", 0, 512, 1, "a"}}));
  EXPECT_EQ(log->bytes_read, archive.size());
  EXPECT_EQ(log->completes, 1);
  TarMember m;
  EXPECT_FALSE(tar.next(m));  // and stays ended
  EXPECT_EQ(log->completes, 1);
}

TEST(TarStream, OneZeroBlockEndsTheArchiveAsInTarfile) {
  const std::string archive = file("a.txt", "a") + std::string(512, '\0');
  EXPECT_EQ(read_all(archive), (std::vector<Got>{{"a.txt", 0, 512, 1, "a"}}));
}

TEST(TarStream, CleanEofOnABlockBoundaryEndsTheArchive) {
  const std::string archive = file("a.txt", "a") + file("b.txt", bytes_of(512, 'b'));
  auto source = std::make_unique<MemorySource>(archive);
  auto log = source->log();
  TarStream tar(std::move(source));
  EXPECT_EQ(read_all(tar), (std::vector<Got>{{"a.txt", 0, 512, 1, "a"},
                                             {"b.txt", 1024, 1536, 512, bytes_of(512, 'b')}}));
  EXPECT_EQ(log->completes, 1);
}

TEST(TarStream, ArchiveOfOnlyEndBlocksHasNoMembers) {
  EXPECT_EQ(read_all(end_blocks()), std::vector<Got>{});
}

TEST(TarStream, NonRegularMembersAreSkipped) {
  const Header dir = test::header("d/", 0, '5');
  const Header old_dir = test::header("olddir/", 0, '\0');  // pre-POSIX: a regular type with a trailing slash
  const Header hard = test::header("hard.txt", 999, '1');   // links have no payload whatever the size field says
  const Header sym = test::header("sym.txt", 0, '2');
  const Header fifo = test::header("fifo", 0, '6');
  const Header unknown = test::header("vol", 10, 'V');      // unknown types are skipped by their size
  const Header old_regular = test::header("r0.txt", 2, '\0');
  const Header contiguous = test::header("r7.txt", 2, '7');
  const std::string archive = header_block(dir) + header_block(old_dir) + header_block(hard) +
                              header_block(sym) + header_block(fifo) + header_block(unknown) +
                              pad("0123456789") + header_block(old_regular) + pad("r0") +
                              header_block(contiguous) + pad("r7") + end_blocks();
  EXPECT_EQ(read_all(archive), (std::vector<Got>{{"r0.txt", 3584, 4096, 2, "r0"},
                                                 {"r7.txt", 4608, 5120, 2, "r7"}}));
}

TEST(TarStream, HugeExtensionRecordIsRefusedBeforeReading) {
  Header h;
  h.name = "PaxHeaders/x";
  h.type = 'x';
  h.size = uint64_t{17} << 20;
  EXPECT_EQ(data_error(header_block(h)),
            "tar archive 'mem.tar': the 'x' extension header at offset 0 declares 17825792 "
            "bytes; refusing more than 16777216");
}

TEST(TarStream, ReadPayloadTwiceIsAUsageError) {
  TarStream tar(std::make_unique<MemorySource>(file("a.txt", "a") + end_blocks()));
  TarMember m;
  ASSERT_TRUE(tar.next(m));
  std::vector<uint8_t> bytes;
  tar.read_payload(bytes);
  const std::optional<Error> e = error_from([&] { tar.read_payload(bytes); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(), "tar archive 'mem.tar': read_payload without a current readable member");
}

TEST(TarStream, ReadPayloadAppends) {
  TarStream tar(std::make_unique<MemorySource>(file("a.txt", "abc") + end_blocks()));
  TarMember m;
  ASSERT_TRUE(tar.next(m));
  std::vector<uint8_t> bytes{'>', '>'};
  tar.read_payload(bytes);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), ">>abc");
}

TEST(TarStream, ReadsAFileInPlace) {
  const test::TempDir dir;
  const Mixed m = mixed_archive();
  const std::string path = dir.write("mixed.tar", m.archive);
  TarStream tar(open_source(path, SourceOptions{}), kSmallBuffer, /*in_place=*/true);
  ASSERT_NE(tar.mapping(), nullptr) << "a local file should be mapped";
  EXPECT_EQ(tar.url(), path);
  std::vector<Got> got;
  TarMember member;
  while (tar.next(member)) {
    const uint8_t* p = tar.payload_in_place();
    // The payload is the file's bytes where they lie.
    EXPECT_EQ(p, tar.mapping()->data() + member.data_offset);
    got.push_back({member.name, member.header_offset, member.data_offset, member.size,
                   std::string(reinterpret_cast<const char*>(p), member.size)});
  }
  EXPECT_EQ(got, m.members);
}

TEST(TarStream, InPlaceTruncatedPayload) {
  const test::TempDir dir;
  Header h;
  h.name = "a.txt";
  h.size = 1000;
  const std::string path = dir.write("cut.tar", header_block(h) + bytes_of(300, 'x'));
  TarStream tar(open_source(path, SourceOptions{}), kSmallBuffer, /*in_place=*/true);
  ASSERT_NE(tar.mapping(), nullptr);
  TarMember m;
  ASSERT_TRUE(tar.next(m));
  const std::optional<Error> e = error_from([&] { tar.payload_in_place(); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(), "truncated tar archive '" + path +
                              "': the stream ends at offset 812 inside the data of member 'a.txt' "
                              "(header at offset 0, 1000 bytes declared)");
}

TEST(TarStream, PayloadInPlaceWithoutAMappingIsAUsageError) {
  TarStream tar(std::make_unique<MemorySource>(file("a.txt", "a") + end_blocks()), kSmallBuffer,
                /*in_place=*/true);  // a memory source cannot be mapped
  EXPECT_EQ(tar.mapping(), nullptr);
  TarMember m;
  ASSERT_TRUE(tar.next(m));
  const std::optional<Error> e = error_from([&] { tar.payload_in_place(); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
}

// The headers of one member, parsed where an index says they are.
MemberHeaders headers_of(const std::string& tar, uint64_t at = 0) {
  return parse_member_headers(reinterpret_cast<const uint8_t*>(tar.data()) + at, tar.size() - at,
                              "s.tar", at);
}

TEST(MemberHeaders, NameSizeAndPayloadStartAsTheStreamResolvesThem) {
  const std::string long_dir(120, 'd');
  const std::string pax = extension('x', test::pax_record("path", long_dir + "/a.txt") +
                                             test::pax_record("size", "5")) +
                          file("ignored", "12345");
  MemberHeaders h = headers_of(pax);
  EXPECT_EQ(h.name, long_dir + "/a.txt");
  EXPECT_EQ(h.size, 5u);
  EXPECT_EQ(h.header_bytes, 3 * 512u);  // PAX header, its records, the member's header
  h = headers_of(extension('L', long_dir + "/b.cls") + file("ignored", "7"));
  EXPECT_EQ(h.name, long_dir + "/b.cls");
  EXPECT_EQ(h.header_bytes, 3 * 512u);
  Header prefixed = test::header("c.cls", 1);
  prefixed.prefix = "dir";
  h = headers_of(file("x.cls", "1") + test::member(prefixed, "2"), 1024);
  EXPECT_EQ(h.name, "dir/c.cls");
  EXPECT_EQ(h.header_bytes, 512u);
}

TEST(MemberHeaders, BytesThatAreNotAPlainMembersHeadersAreRefused) {
  const std::string tar = file("a.cls", "1") + file("b.cls", "2");
  const std::optional<Error> inside = error_from([&] { headers_of(tar, 1); });
  ASSERT_TRUE(inside);
  EXPECT_EQ(inside->kind(), ErrorKind::kData);
  EXPECT_NE(inside->message().find("no valid tar header at offset 1"), std::string::npos)
      << inside->message();
  const std::optional<Error> directory =
      error_from([&] { headers_of(test::member(test::header("d/", 0, '5'), "")); });
  ASSERT_TRUE(directory);
  EXPECT_NE(directory->message().find("is not a plain file's (type '5')"), std::string::npos);
  const std::string pax = extension('x', test::pax_record("path", std::string(300, 'p') + ".txt"));
  const std::optional<Error> cut = error_from([&] { headers_of(pax.substr(0, 700)); });
  ASSERT_TRUE(cut);
  EXPECT_NE(cut->message().find("runs past the 700 bytes read"), std::string::npos)
      << cut->message();
  const std::optional<Error> no_member = error_from([&] { headers_of(pax); });
  ASSERT_TRUE(no_member);
  EXPECT_NE(no_member->message().find("no member header in the 1024 bytes at offset 0"),
            std::string::npos)
      << no_member->message();
}

}  // namespace
}  // namespace chute

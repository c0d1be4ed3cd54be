#include "tar/sample_reader.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "tar/archive_testing.h"

namespace chute {
namespace {

using test::end_blocks;
using test::error_from;
using test::file;
using test::MemorySource;

struct Member {
  std::string extension;
  std::string name;
  uint64_t header_offset;
  std::string payload;
  bool operator==(const Member& o) const {
    return extension == o.extension && name == o.name && header_offset == o.header_offset &&
           payload == o.payload;
  }
};

struct Sample {
  std::string key;
  uint64_t offset;
  uint64_t end_offset;
  std::vector<Member> members;
  bool operator==(const Sample& o) const {
    return key == o.key && offset == o.offset && end_offset == o.end_offset &&
           members == o.members;
  }
};

void PrintTo(const Sample& s, std::ostream* os) {
  *os << "{key '" << s.key << "' @" << s.offset << ".." << s.end_offset << ":";
  for (const Member& m : s.members) {
    *os << " ['" << m.extension << "' '" << m.name << "' @" << m.header_offset << " '"
        << m.payload << "']";
  }
  *os << "}";
}

// The sample as the tests compare it; also checks the bookkeeping that every
// sample must satisfy.
Sample simplify(const EncodedSample& s) {
  Sample out{s.key, s.offset, s.end_offset, {}};
  size_t payload = 0;
  for (const SampleMember& m : s.members) {
    out.members.push_back({m.extension, m.name, m.offset,
                           std::string(reinterpret_cast<const char*>(s.bytes()) + m.data_begin,
                                       m.data_size)});
    payload += m.data_size;
  }
  EXPECT_EQ(s.payload_bytes, payload);
  return out;
}

std::vector<Sample> read_samples(SampleReader& reader) {
  std::vector<Sample> out;
  EncodedSample s;
  while (reader.next(s)) out.push_back(simplify(s));
  return out;
}

std::vector<Sample> read_samples(const std::string& archive) {
  SampleReader reader(std::make_unique<MemorySource>(archive), 0);
  return read_samples(reader);
}

TEST(SampleReader, GroupsConsecutiveMembersByKey) {
  const std::string archive = file("dir/abc.jpg", "JPG") + file("dir/abc.cls", "7") +
                              file("dir/abd.jpg", "J2") + end_blocks();
  SampleReader reader(std::make_unique<MemorySource>(archive), 5);
  EXPECT_FALSE(reader.in_place());
  EncodedSample s;
  ASSERT_TRUE(reader.next(s));
  EXPECT_EQ(s.source_index, 5u);
  EXPECT_EQ(s.in_place, nullptr);
  // Payloads are copied back to back.
  EXPECT_EQ(std::string(s.data.begin(), s.data.end()), "JPG7");
  ASSERT_EQ(s.members.size(), 2u);
  EXPECT_EQ(s.members[0].data_begin, 0u);
  EXPECT_EQ(s.members[1].data_begin, 3u);
  ASSERT_NE(s.find("cls"), nullptr);
  EXPECT_EQ(s.find("cls")->name, "dir/abc.cls");
  EXPECT_EQ(s.find("png"), nullptr);
  // The sample spans from its first header to the end of its last payload.
  EXPECT_EQ(simplify(s), (Sample{"dir/abc", 0, 1537,
                                 {{"jpg", "dir/abc.jpg", 0, "JPG"}, {"cls", "dir/abc.cls", 1024, "7"}}}));
  ASSERT_TRUE(reader.next(s));  // the same object again: nothing of the first sample stays
  EXPECT_EQ(simplify(s), (Sample{"dir/abd", 2048, 2562, {{"jpg", "dir/abd.jpg", 2048, "J2"}}}));
  EXPECT_EQ(std::string(s.data.begin(), s.data.end()), "J2");
  EXPECT_FALSE(reader.next(s));
  EXPECT_FALSE(reader.next(s));
}

TEST(SampleReader, KeyEndsAtTheFirstDotOfTheBasename) {
  const std::string archive = file("s1.Seg.PNG", "p") + file("s1.nsdgeneral.npy", "n") +
                              file("a.b/c.d.e", "x") + file("a.b/c.JSON", "j") + end_blocks();
  EXPECT_EQ(read_samples(archive),
            (std::vector<Sample>{
                {"s1", 0, 1537, {{"seg.png", "s1.Seg.PNG", 0, "p"}, {"nsdgeneral.npy", "s1.nsdgeneral.npy", 1024, "n"}}},
                {"a.b/c", 2048, 3585, {{"d.e", "a.b/c.d.e", 2048, "x"}, {"json", "a.b/c.JSON", 3072, "j"}}}}));
}

TEST(SampleReader, MembersWithoutADotInTheBasenameAreSkipped) {
  // A skipped member does not split the sample around it (webdataset drops
  // it before grouping).
  const std::string archive = file("README", "r") + file("a.jpg", "1") + file("dir.d/NOTES", "n") +
                              file("a.cls", "2") + end_blocks();
  EXPECT_EQ(read_samples(archive),
            (std::vector<Sample>{{"a", 1024, 3585, {{"jpg", "a.jpg", 1024, "1"}, {"cls", "a.cls", 3072, "2"}}}}));
}

TEST(SampleReader, BasenameStartingWithADot) {
  // webdataset's regex backtracks: "d/.x.y" is key "d/", extension "x.y";
  // without a directory, or when the last directory has a dot, nothing matches.
  const std::string archive =
      file("d/.x.y", "1") + file(".hidden", "2") + file("e.f/.g", "3") + end_blocks();
  EXPECT_EQ(read_samples(archive), (std::vector<Sample>{{"d/", 0, 513, {{"x.y", "d/.x.y", 0, "1"}}}}));
}

TEST(SampleReader, MetadataMembersAreSkipped) {
  const std::string archive = file("__meta__/info.json", "m") + file("__x__", "x") +
                              file("a/__meta__/b.txt", "b") + end_blocks();
  EXPECT_EQ(read_samples(archive),
            (std::vector<Sample>{{"a/__meta__/b", 2048, 2561, {{"txt", "a/__meta__/b.txt", 2048, "b"}}}}));
}

TEST(SampleReader, SameKeyApartMakesSeparateSamples) {
  const std::string archive =
      file("a.jpg", "1") + file("b.jpg", "2") + file("a.cls", "3") + end_blocks();
  EXPECT_EQ(read_samples(archive), (std::vector<Sample>{{"a", 0, 513, {{"jpg", "a.jpg", 0, "1"}}},
                                                        {"b", 1024, 1537, {{"jpg", "b.jpg", 1024, "2"}}},
                                                        {"a", 2048, 2561, {{"cls", "a.cls", 2048, "3"}}}}));
}

// The error the reader throws next, whether it goes on after it and the
// samples it cost.
struct Thrown {
  std::string message;
  bool resumable;
  uint64_t lost;
};

Thrown thrown(SampleReader& reader) {
  EncodedSample s;
  const std::optional<Error> e = error_from([&] { reader.next(s); });
  if (!e) return {"<no error>", false, 99};
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  // Whatever went wrong in the archive, the reader marks it a read failure
  // of its shard.
  EXPECT_EQ(e->scope(), ErrorScope::kRead);
  EXPECT_EQ(e->place().url, "mem.tar");
  return {e->message(), reader.failure().resumable, reader.failure().samples_lost};
}

TEST(SampleReader, RepeatedExtensionIsLeftOutAndReportedAfterTheSample) {
  // As webdataset under a handler that goes on: the repeat is dropped, the
  // sample keeps its first member, and the error follows it.
  const std::string archive = file("z.txt", "z") + file("a.jpg", "1") + file("a.cls", "c") +
                              file("a.JPG", "2") + file("b.jpg", "3") + end_blocks();
  SampleReader reader(std::make_unique<MemorySource>(archive), 0);
  EncodedSample s;
  ASSERT_TRUE(reader.next(s));
  EXPECT_EQ(s.key, "z");
  EXPECT_FALSE(s.flawed);
  ASSERT_TRUE(reader.next(s));
  EXPECT_TRUE(s.flawed);
  EXPECT_EQ(simplify(s), (Sample{"a", 1024, 2561, {{"jpg", "a.jpg", 1024, "1"}, {"cls", "a.cls", 2048, "c"}}}));
  const Thrown t = thrown(reader);
  EXPECT_EQ(t.message,
            "duplicate file name in tar archive 'mem.tar': member 'a.JPG' at offset 3072 repeats "
            "extension 'jpg' of sample 'a' (sample at offset 1024)");
  EXPECT_TRUE(t.resumable);
  EXPECT_EQ(t.lost, 0u);
  ASSERT_TRUE(reader.next(s));
  EXPECT_FALSE(s.flawed);
  EXPECT_EQ(simplify(s), (Sample{"b", 4096, 4609, {{"jpg", "b.jpg", 4096, "3"}}}));
  EXPECT_FALSE(reader.next(s));
}

TEST(SampleReader, KeyAndUrlExtensionsCollideWithWebdatasetsFields) {
  for (const char* name : {"a.__key__", "a.__url__"}) {
    SampleReader reader(
        std::make_unique<MemorySource>(file("a.txt", "t") + file(name, "k") + end_blocks()), 0);
    EncodedSample s;
    ASSERT_TRUE(reader.next(s));
    EXPECT_TRUE(s.flawed);
    EXPECT_EQ(simplify(s), (Sample{"a", 0, 513, {{"txt", "a.txt", 0, "t"}}}));
    EXPECT_EQ(thrown(reader).message,
              std::string("duplicate file name in tar archive 'mem.tar': member '") + name +
                  "' at offset 1024 repeats extension '" + (name + 2) +
                  "' of sample 'a' (sample at offset 0)");
    EXPECT_FALSE(reader.next(s));
  }
}

TEST(SampleReader, AnUnreadableMemberLosesItsSampleOnly) {
  const std::string bad_sparse =
      test::extension('x', test::pax_record("GNU.sparse.size", "10") +
                               test::pax_record("GNU.sparse.map", "0,99")) +
      file("b.bin", "xyz");
  for (size_t max_read : {size_t{1}, size_t{1} << 20}) {
    const std::string archive = file("a.txt", "a") + file("b.cls", "1") + bad_sparse +
                                file("b.txt", "b") + file("c.txt", "c") + end_blocks();
    SampleReader reader(std::make_unique<MemorySource>(archive, max_read), 0);
    EncodedSample s;
    ASSERT_TRUE(reader.next(s));
    EXPECT_EQ(s.key, "a");
    const Thrown t = thrown(reader);
    EXPECT_EQ(t.message,
              "tar archive 'mem.tar': member 'b.bin' at offset 2048 cannot be read: its GNU sparse "
              "map has a region (offset 0, 99 bytes) out of order or past the file's 10 bytes "
              "(sample 'b' at offset 1024 is lost)");
    EXPECT_TRUE(t.resumable);
    EXPECT_EQ(t.lost, 1u);
    ASSERT_TRUE(reader.next(s));
    EXPECT_EQ(simplify(s), (Sample{"c", 5120, 5633, {{"txt", "c.txt", 5120, "c"}}}));
    EXPECT_FALSE(reader.next(s));
  }
}

TEST(SampleReader, ACutDeliversTheMembersReadBeforeItThenItsError) {
  test::Header cut = test::header("b.bin", 2000);
  const std::string archive =
      file("a.txt", "a") + file("b.txt", "b") + file("b.cls", "1") + test::header_block(cut) + "short";
  SampleReader reader(std::make_unique<MemorySource>(archive), 0);
  EncodedSample s;
  ASSERT_TRUE(reader.next(s));
  EXPECT_FALSE(s.flawed);
  ASSERT_TRUE(reader.next(s));
  EXPECT_TRUE(s.flawed);
  EXPECT_EQ(simplify(s), (Sample{"b", 1024, 2561, {{"txt", "b.txt", 1024, "b"}, {"cls", "b.cls", 2048, "1"}}}));
  const Thrown t = thrown(reader);
  EXPECT_EQ(t.message,
            "truncated tar archive 'mem.tar': the stream ends at offset 3589 inside the data of "
            "member 'b.bin' (header at offset 3072, 2000 bytes declared)");
  EXPECT_FALSE(t.resumable);
  EXPECT_EQ(t.lost, 1u);  // the sample it cut short (delivered as read)
  EXPECT_FALSE(reader.next(s));
  EXPECT_FALSE(reader.next(s));
}

TEST(SampleReader, ACutInTheFirstMemberOfASampleLosesIt) {
  test::Header h;
  h.name = "a.bin";
  h.size = 2000;
  SampleReader reader(
      std::make_unique<MemorySource>(file("ok.txt", "o") + test::header_block(h) + "short"), 0);
  EncodedSample s;
  ASSERT_TRUE(reader.next(s));
  EXPECT_FALSE(s.flawed);
  const Thrown t = thrown(reader);
  EXPECT_EQ(t.message,
            "truncated tar archive 'mem.tar': the stream ends at offset 1541 inside the data of "
            "member 'a.bin' (header at offset 1024, 2000 bytes declared)");
  EXPECT_FALSE(t.resumable);
  EXPECT_EQ(t.lost, 1u);
  EXPECT_FALSE(reader.next(s));
}

TEST(SampleReader, ACorruptHeaderEndsTheArchiveAfterWhatWasRead) {
  test::Header bad = test::header("a.cls", 1);
  bad.corrupt_checksum = true;
  SampleReader reader(std::make_unique<MemorySource>(file("a.txt", "a") + test::member(bad, "1") +
                                                     file("b.txt", "b") + end_blocks()),
                      0);
  EncodedSample s;
  ASSERT_TRUE(reader.next(s));
  // Its member came whole before the header that ends the archive.
  EXPECT_FALSE(s.flawed);
  EXPECT_EQ(simplify(s), (Sample{"a", 0, 513, {{"txt", "a.txt", 0, "a"}}}));
  const Thrown t = thrown(reader);
  EXPECT_EQ(t.message, "bad header checksum in tar archive 'mem.tar' at offset 1024");
  EXPECT_FALSE(t.resumable);
  EXPECT_EQ(t.lost, 1u);
  EXPECT_FALSE(reader.next(s));
}

TEST(SampleReader, ACutAtTheNextMembersFirstHeaderLeavesASampleWholeElsewhereItIsFlawed) {
  const std::string archive = file("a.txt", "a") + file("a.cls", "1") + file("b.txt", "b");
  // Inside b.txt's header: a is whole as far as the archive tells.
  {
    SampleReader reader(std::make_unique<MemorySource>(archive.substr(0, 2048 + 100)), 0);
    EncodedSample s;
    ASSERT_TRUE(reader.next(s));
    EXPECT_FALSE(s.flawed);
    EXPECT_EQ(s.members.size(), 2u);
    EXPECT_FALSE(thrown(reader).resumable);
  }
  // Inside the PAX header of the member after a: tarfile raises there, so a
  // is flawed.
  {
    const std::string pax = file("a.txt", "a") + file("a.cls", "1") +
                            test::extension('x', test::pax_record("path", "b.txt")) +
                            file("b.txt", "b");
    SampleReader reader(std::make_unique<MemorySource>(pax.substr(0, 2048 + 700)), 0);
    EncodedSample s;
    ASSERT_TRUE(reader.next(s));
    EXPECT_TRUE(s.flawed);
    EXPECT_EQ(s.members.size(), 2u);
  }
  // Inside a.cls's padding: its payload is whole, yet a was cut.
  {
    SampleReader reader(std::make_unique<MemorySource>(archive.substr(0, 1536 + 100)), 0);
    EncodedSample s;
    ASSERT_TRUE(reader.next(s));
    EXPECT_TRUE(s.flawed);
    EXPECT_EQ(s.members.size(), 2u);
    EXPECT_EQ(thrown(reader).message,
              "truncated tar archive 'mem.tar': the stream ends at offset 1636 inside the padding "
              "of member 'a.cls' (header at offset 1024, 1 bytes declared)");
  }
}

TEST(SampleReader, ALostSampleThenACut) {
  const std::string bad_sparse =
      test::extension('x', test::pax_record("GNU.sparse.map", "0,1")) + file("a.bin", "x");
  const std::string archive = bad_sparse + test::header_block(test::header("a.cls", 100)) + "1";
  SampleReader reader(std::make_unique<MemorySource>(archive), 0);
  const Thrown lost = thrown(reader);
  EXPECT_EQ(lost.message,
            "tar archive 'mem.tar': member 'a.bin' at offset 0 cannot be read: GNU sparse member "
            "without an expanded size (sample 'a' at offset 0 is lost)");
  EXPECT_TRUE(lost.resumable);
  EXPECT_EQ(lost.lost, 1u);
  const Thrown cut = thrown(reader);
  EXPECT_EQ(cut.message,
            "truncated tar archive 'mem.tar': the stream ends at offset 2561 inside the data of "
            "member 'a.cls' (header at offset 2048, 100 bytes declared)");
  EXPECT_FALSE(cut.resumable);
  EXPECT_EQ(cut.lost, 0u);  // the cut is inside the sample already lost
  EncodedSample s;
  EXPECT_FALSE(reader.next(s));
}

TEST(SampleReader, EmptyArchiveHasNoSamples) {
  EXPECT_EQ(read_samples(end_blocks()), std::vector<Sample>{});
}

TEST(SampleReader, InPlaceSamplesPointIntoTheMapping) {
  const test::TempDir dir;
  const std::string archive = file("k1.jpg", "JPEG") + file("k1.cls", "3") + file("k2.jpg", "J") +
                              end_blocks();
  const std::string path = dir.write("shard.tar", archive);
  SampleReader reader(open_source(path, SourceOptions{}), 2, /*in_place=*/true);
  ASSERT_TRUE(reader.in_place());
  EncodedSample s;
  ASSERT_TRUE(reader.next(s));
  ASSERT_NE(s.in_place, nullptr);
  EXPECT_TRUE(s.data.empty());
  EXPECT_EQ(s.source_index, 2u);
  EXPECT_FALSE(s.in_place->refresh());
  EXPECT_FALSE(s.in_place->lost(s));
  // data_begin is the payload's offset in the file.
  ASSERT_EQ(s.members.size(), 2u);
  EXPECT_EQ(s.members[0].data_begin, 512u);
  EXPECT_EQ(s.members[1].data_begin, 1536u);
  EXPECT_EQ(simplify(s), (Sample{"k1", 0, 1537, {{"jpg", "k1.jpg", 0, "JPEG"}, {"cls", "k1.cls", 1024, "3"}}}));
  ASSERT_TRUE(reader.next(s));
  EXPECT_EQ(simplify(s), (Sample{"k2", 2048, 2561, {{"jpg", "k2.jpg", 2048, "J"}}}));
  EXPECT_FALSE(reader.next(s));
}

TEST(SampleReader, InPlaceSampleWithASparseMemberIsCopied) {
  const test::TempDir dir;
  const std::string archive = file("k1.jpg", "JPEG") +
                              test::old_gnu_sparse("k1.bin", 600, {{500, 3}}, "xyz") +
                              file("k2.jpg", "J") + end_blocks();
  const std::string path = dir.write("shard.tar", archive);
  SampleReader reader(open_source(path, SourceOptions{}), 0, /*in_place=*/true);
  EncodedSample s;
  ASSERT_TRUE(reader.next(s));
  EXPECT_EQ(s.in_place, nullptr);
  EXPECT_EQ(simplify(s), (Sample{"k1", 0, 1539,
                                 {{"jpg", "k1.jpg", 0, "JPEG"},
                                  {"bin", "k1.bin", 1024, std::string(500, '\0') + "xyz" + std::string(97, '\0')}}}));
  ASSERT_TRUE(reader.next(s));
  EXPECT_NE(s.in_place, nullptr);
  EXPECT_EQ(simplify(s), (Sample{"k2", 2048, 2561, {{"jpg", "k2.jpg", 2048, "J"}}}));
  EXPECT_FALSE(reader.next(s));
}

}  // namespace
}  // namespace chute

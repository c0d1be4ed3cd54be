#include "tar/sample_key.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace chute {
namespace {

// "key|extension", or "-" when webdataset drops the member.
std::string split(const std::string& name) {
  const std::optional<SampleKey> k = split_sample_key(name);
  if (!k) return "-";
  EXPECT_EQ(sample_key_length(name), k->key_length);
  return name.substr(0, k->key_length) + "|" + k->extension;
}

TEST(SampleKey, KeyEndsAtTheFirstDotOfTheBasename) {
  EXPECT_EQ(split("abc.jpg"), "abc|jpg");
  EXPECT_EQ(split("dir/abc.seg.png"), "dir/abc|seg.png");
  EXPECT_EQ(split("a.b/c.d.e"), "a.b/c|d.e");
  EXPECT_EQ(split("x."), "x|");
}

TEST(SampleKey, ExtensionsAreLowercasedAsPythonDoes) {
  EXPECT_EQ(split("K.JPG"), "K|jpg");
  EXPECT_EQ(split("K.Seg.PNG"), "K|seg.png");
  EXPECT_EQ(split("K.\xc3\x9c"), "K|\xc3\xbc");  // Ü → ü
  EXPECT_EQ(split("K.\xc4\xb0"), "K|i\xcc\x87");  // İ → i + combining dot
  // Σ → ς at the end of a word, σ elsewhere.
  EXPECT_EQ(split("K.\xce\x91\xce\xa3"), "K|\xce\xb1\xcf\x82");
  EXPECT_EQ(split("K.\xce\xa3\xce\x91"), "K|\xcf\x83\xce\xb1");
  // Bytes that are not UTF-8 stay; the letters around them are lowered.
  // (A literal ends after \xc3: "\xc3B" would be one out-of-range escape.)
  EXPECT_EQ(split("K.A\xff\xc3" "B"), "K|a\xff\xc3" "b");
  EXPECT_EQ(split("K.\xed\xa0\x80X"), "K|\xed\xa0\x80x");  // an encoded surrogate is not UTF-8
}

TEST(SampleKey, NamesWithoutAKeyAndExtensionAreDropped) {
  EXPECT_EQ(split("README"), "-");
  EXPECT_EQ(split("dir.d/NOTES"), "-");
  EXPECT_EQ(split(".hidden"), "-");
  EXPECT_EQ(split("e.f/.g"), "-");
  EXPECT_EQ(split(""), "-");
}

TEST(SampleKey, BasenameStartingWithADotBacktracks) {
  // webdataset's regex: "d/.x.y" is key "d/", extension "x.y".
  EXPECT_EQ(split("d/.x.y"), "d/|x.y");
  EXPECT_EQ(split("a/d/.x"), "a/d/|x");
  // `.*/` stops at a newline, `[^.]+` does not: a newline in the
  // directories matters only where the part before it needs `.*/`.
  EXPECT_EQ(split("a\nb/.x"), "a\nb/|x");
  EXPECT_EQ(split("a\nb.c"), "a\nb|c");
  EXPECT_EQ(split("a.b/c\nd/.x"), "a.b/c\nd/|x");
  EXPECT_EQ(split("x/a.b\n/.y"), "-");
  EXPECT_EQ(split("a.b\nc/d.x"), "-");
  EXPECT_EQ(split("a.b\n"), "a|b\n");
  EXPECT_EQ(split("a.b/"), "-");
}

TEST(SampleKey, MetadataMembersAreDropped) {
  EXPECT_EQ(split("__meta__/info.json"), "-");
  EXPECT_EQ(split("__x__"), "-");
  EXPECT_EQ(split("__x__.json"), "__x__|json");  // a top-level name must end in "__"
  EXPECT_EQ(split("a/__meta__/b.txt"), "a/__meta__/b|txt");
  EXPECT_EQ(split("__/x.txt"), "__/x|txt");
}

TEST(SampleKey, BytesThatAreNotUtf8AreKeptAsTheyAre) {
  // tarfile decodes them with surrogateescape; the split only looks at ASCII.
  EXPECT_EQ(split("a\xff" "b.cls"), "a\xff" "b|cls");
  EXPECT_EQ(split("dir\xfe/k.\xe9x"), "dir\xfe/k|\xe9x");
}

}  // namespace
}  // namespace chute

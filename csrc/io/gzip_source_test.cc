#include "io/gzip_source.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "io/byte_source.h"
#include "io/mapped_region.h"

namespace chute {
namespace {

// One gzip member holding `data` (zlib's deflate with the gzip wrapper).
std::string gzip(const std::string& data) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, static_cast<uLong>(data.size())) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string pattern(size_t n) {
  std::string s(n, '\0');
  uint32_t x = 12345;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245 + 12345;
    s[i] = static_cast<char>((i % 7 == 0) ? (x >> 16) : 'a' + i % 13);
  }
  return s;
}

std::string read_all(ByteSource& source, size_t step) {
  std::string out;
  std::vector<uint8_t> buf(step);
  for (;;) {
    const size_t k = source.read(buf.data(), buf.size());
    if (k == 0) return out;
    out.append(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(k));
  }
}

std::unique_ptr<ByteSource> open(const std::string& path) { return open_source(path, {}); }

TEST(GzipSource, InflatesWhateverTheNameAndReadSize) {
  const test::TempDir dir;
  const std::string data = pattern(300000);
  const std::string path = dir.write("shard.tar", gzip(data));  // the name says nothing
  for (size_t step : {1u, 7u, 4096u, 1u << 20}) {
    auto source = open(path);
    EXPECT_EQ(read_all(*source, step), data) << "step " << step;
    EXPECT_EQ(source->map_file(), nullptr);  // inflated bytes are not in the file
  }
}

TEST(GzipSource, ConcatenatedMembersAndTrailingBytes) {
  const test::TempDir dir;
  const std::string data = pattern(50000);
  const std::string members = gzip(data.substr(0, 10)) + gzip(data.substr(10, 20000)) +
                              gzip("") + gzip(data.substr(20010));
  EXPECT_EQ(read_all(*open(dir.write("multi.gz", members)), 333), data);
  // Bytes after a complete member that do not start another: ignored, as gzip -d does.
  EXPECT_EQ(read_all(*open(dir.write("tail.gz", gzip(data) + std::string(512, '\0'))), 4096),
            data);
}

TEST(GzipSource, ACutStreamIsAnErrorNamingTheUrl) {
  const test::TempDir dir;
  const std::string packed = gzip(pattern(200000));
  for (size_t cut : {size_t{2}, size_t{10}, packed.size() / 2, packed.size() - 1}) {
    const std::string path = dir.write("cut.tgz", packed.substr(0, cut));
    std::optional<Error> e = test::error_from([&] {
      auto source = open(path);
      read_all(*source, 4096);
    });
    ASSERT_TRUE(e) << "cut at " << cut;
    EXPECT_EQ(e->kind(), ErrorKind::kData);
    EXPECT_NE(e->message().find("truncated gzip stream '" + path + "'"), std::string::npos)
        << e->message();
  }
}

TEST(GzipSource, CorruptDataIsAnError) {
  const test::TempDir dir;
  std::string packed = gzip(pattern(100000));
  for (size_t i = 100; i < 140; ++i) packed[i] = static_cast<char>(packed[i] ^ 0x5a);
  const std::string path = dir.write("bad.gz", packed);
  std::optional<Error> e = test::error_from([&] { read_all(*open(path), 4096); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_NE(e->message().find("corrupt gzip stream '" + path + "'"), std::string::npos)
      << e->message();
}

TEST(GzipSource, PlainSourcesPassThroughAndStayMappable) {
  const test::TempDir dir;
  const std::string data = pattern(10000);
  const std::string path = dir.write("plain.tar", data);
  auto source = open(path);
  EXPECT_EQ(read_all(*source, 3), data);  // the bytes read to recognise it come back first
  auto mapped = open(path)->map_file();
  ASSERT_NE(mapped, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(mapped->data()), mapped->size()), data);
  EXPECT_EQ(read_all(*open(dir.write("short", "ab")), 1), "ab");
  EXPECT_EQ(read_all(*open(dir.write("empty", "")), 1), "");
}

TEST(GzipSource, OtherCompressionsAreRefusedWithAWayOut) {
  const test::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("BZh91AY&SY") + pattern(40), "bzip2-compressed stream"},
      {std::string("\xfd" "7zXZ\0\0", 7) + pattern(40), "xz-compressed stream"},
      {std::string("\x28\xb5\x2f\xfd", 4) + pattern(40), "zstd-compressed stream"},
  };
  for (const auto& [bytes, words] : cases) {
    const std::string path = dir.write("packed", bytes);
    auto source = open(path);  // opening reads nothing; the first read recognises it
    EXPECT_EQ(source->map_file(), nullptr);
    std::optional<Error> e = test::error_from([&] { read_all(*source, 4096); });
    ASSERT_TRUE(e) << words;
    EXPECT_EQ(e->kind(), ErrorKind::kData);
    EXPECT_NE(e->message().find(words), std::string::npos) << e->message();
    EXPECT_NE(e->message().find("pipe:"), std::string::npos) << e->message();
  }
}

}  // namespace
}  // namespace chute

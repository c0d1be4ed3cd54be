#include "io/byte_source.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "io/mapped_region.h"
#include "io/remote_source.h"

namespace chute {
namespace {

std::string read_all(ByteSource& source, size_t step = 7) {
  std::string out;
  std::vector<uint8_t> buf(step);
  for (;;) {
    const size_t k = source.read(buf.data(), buf.size());
    if (k == 0) return out;
    out.append(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(k));
  }
}

std::optional<Error> open_error(const std::string& url, const SourceOptions& options = {}) {
  return test::error_from([&] { open_source(url, options); });
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

TEST(CacheFileName, HashOfTheUrlAndAReadableBase) {
  // The hashes are FNV-1a 64 of the whole url, from an independent implementation.
  EXPECT_EQ(cache_file_name("pipe:curl -s https://h/d/train-0001.tar?sig=x"),
            "5ad7b358e1a2179c-train-0001.tar");
  EXPECT_EQ(cache_file_name("pipe:cat"), "1e8ee27bb520354b-cat");
  // The last token with '/' or '.', cut at '#', unsafe bytes replaced.
  EXPECT_EQ(cache_file_name("pipe:gsutil cat gs://b/x y@z#1.tar"), "4a304d8500f90612-y_z");
  EXPECT_EQ(cache_file_name("pipe:.."), "3dd242ba3fcfb0c1-shard");
  EXPECT_EQ(cache_file_name("pipe:" + std::string(100, 'a') + ".tar"),
            "b18ef0081d1ceb90-" + std::string(80, 'a'));
}

TEST(RemoteSchemes, NamesAndAliasesInAnyCaseAreRemote) {
  for (const RemoteScheme& scheme : remote_schemes()) {
    EXPECT_TRUE(is_remote_url(scheme.name + "://bucket/key")) << scheme.name;
    for (const std::string& alias : scheme.aliases) {
      EXPECT_TRUE(is_remote_url(alias + "://bucket/key")) << alias;
    }
  }
  EXPECT_TRUE(is_remote_url("S3A://bucket/key"));
  EXPECT_TRUE(is_remote_url("Https://host/key"));
  for (const char* url : {"ftp://host/key", "s3:/bucket/key", "file:///x.tar", "pipe:cat x",
                          "x.tar", "://bucket/key"}) {
    EXPECT_FALSE(is_remote_url(url)) << url;
  }
}

TEST(OpenSource, UrlErrors) {
  std::optional<Error> e = open_error("s3://bucket/shard.tar");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(),
            "cannot read 's3://bucket/shard.tar' here: remote urls are read through chute.remote "
            "(pip install 'chute[remote]'), or wrap it in a pipe, e.g. "
            "'pipe:curl -sf s3://bucket/shard.tar'");
  e = open_error("ftp://host/shard.tar");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(),
            "unsupported url 'ftp://host/shard.tar': chute reads local files, pipe: commands and "
            "http://, https://, s3://, s3a://, gs://, az://, azure://, abfs://, abfss://, adl://, "
            "hf:// urls; for others use a pipe, e.g. 'pipe:curl -sf ftp://host/shard.tar'");
  e = open_error("pipe: \t");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(), "empty pipe command in url 'pipe: \t'");
  e = open_error("file:");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "empty file path in url 'file:'");
  e = open_error("/no/such/dir/shard.tar");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kIo);
  EXPECT_EQ(e->message(), "cannot open '/no/such/dir/shard.tar': No such file or directory");
  EXPECT_EQ(e->os_failure().number, ENOENT);
  EXPECT_EQ(e->os_failure().path, "/no/such/dir/shard.tar");
  e = open_error("file:///no/such.tar");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "cannot open 'file:///no/such.tar' (file '/no/such.tar'): No such file or directory");
  EXPECT_EQ(e->os_failure().path, "/no/such.tar");
  // Urls that are not OS errors carry no number.
  e = open_error("ftp://host/shard.tar");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->os_failure().number, 0);
}

TEST(OpenSource, ADirectoryOrAFileInThePathCarriesItsErrno) {
  const test::TempDir dir;
  // A directory opens, and fails at its first read.
  std::unique_ptr<ByteSource> source = open_source(dir.path(), SourceOptions{});
  std::optional<Error> e = test::error_from([&] { read_all(*source); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "read error in '" + dir.path() + "' at offset 0: Is a directory");
  EXPECT_EQ(e->os_failure().number, EISDIR);
  EXPECT_EQ(e->os_failure().path, dir.path());
  const std::string through = dir.write("f", "x") + "/shard.tar";
  e = open_error(through);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->os_failure().number, ENOTDIR);
  EXPECT_EQ(e->os_failure().path, through);
  // Root reads a file whatever its mode: the case needs another user.
  if (::geteuid() == 0) GTEST_SKIP() << "runs as root, which no file mode keeps out";
  const std::string locked = dir.write("locked.tar", "x");
  ASSERT_EQ(::chmod(locked.c_str(), 0), 0);
  e = open_error(locked);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->os_failure().number, EACCES);
  EXPECT_EQ(e->os_failure().path, locked);
}

TEST(OpenSource, LocalFilesUnderEveryUrlForm) {
  const test::TempDir dir;
  // "://" after a '/' is part of a path, not a scheme.
  std::filesystem::create_directory(dir.path() + "/a:");
  const std::string path = dir.write("a://b", "content of the shard");
  for (const std::string& url : {path, "file:" + path, "file://" + path}) {
    std::unique_ptr<ByteSource> source = open_source(url, SourceOptions{});
    EXPECT_EQ(source->url(), url);
    EXPECT_EQ(read_all(*source), "content of the shard");
  }
}

TEST(OpenSource, FilesMapButEmptyFilesDoNot) {
  const test::TempDir dir;
  std::unique_ptr<ByteSource> full = open_source(dir.write("f", "0123456789"), SourceOptions{});
  const std::shared_ptr<MappedFile> mapping = full->map_file();
  ASSERT_NE(mapping, nullptr);
  EXPECT_EQ(mapping->size(), 10u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(mapping->data()), 10), "0123456789");
  EXPECT_FALSE(mapping->check_size());
  std::unique_ptr<ByteSource> empty = open_source(dir.write("e", ""), SourceOptions{});
  EXPECT_EQ(empty->map_file(), nullptr);
  EXPECT_EQ(read_all(*empty), "");
}

TEST(PipeSource, ReadsTheCommandsOutput) {
  std::unique_ptr<ByteSource> source = open_source("pipe:printf 'abc%sdef' 123", SourceOptions{});
  EXPECT_EQ(source->url(), "pipe:printf 'abc%sdef' 123");
  EXPECT_EQ(read_all(*source, 2), "abc123def");
  std::vector<uint8_t> buf(4);
  EXPECT_EQ(source->read(buf.data(), buf.size()), 0u);  // stays at the end
  EXPECT_EQ(source->map_file(), nullptr);
}

TEST(PipeSource, FailingCommandReportsItsStatusAndStderr) {
  std::unique_ptr<ByteSource> source =
      open_source("pipe:printf xy; echo 'no such object' >&2; exit 3", SourceOptions{});
  std::string got;
  const std::optional<Error> e = test::error_from([&] { got = read_all(*source); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kIo);
  EXPECT_EQ(e->message(), "pipe command 'printf xy; echo 'no such object' >&2; exit 3' exited with "
                          "status 3 after 2 bytes: no such object");
  EXPECT_EQ(e->os_failure().number, 0);  // the command failed, not a system call
  const std::optional<Error> again = test::error_from([&] { read_all(*source); });
  ASSERT_TRUE(again);
  EXPECT_EQ(again->message(), "pipe source 'pipe:printf xy; echo 'no such object' >&2; exit 3' was "
                              "read after it failed");
}

TEST(PipeSource, SilentCommandTimesOut) {
  SourceOptions options;
  options.pipe_timeout_s = 0.2;
  std::unique_ptr<ByteSource> source = open_source("pipe:sleep 30", options);
  const std::optional<Error> e = test::error_from([&] { read_all(*source); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kTimeout);
  EXPECT_EQ(e->message(), "pipe command 'sleep 30' produced no data for 0.2 s (at offset 0); "
                          "killed it: (no stderr output)");
}

TEST(PipeSource, CancelledReaderStops) {
  std::atomic<bool> cancel{true};
  SourceOptions options;
  options.cancel = &cancel;
  std::unique_ptr<ByteSource> source = open_source("pipe:sleep 30", options);
  const std::optional<Error> e = test::error_from([&] { read_all(*source); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kIo);
  EXPECT_EQ(e->message(), "pipe command 'sleep 30' for 'pipe:sleep 30' was stopped at offset 0: "
                          "its reader was closed");
}

TEST(PipeCache, PublishedOnlyAfterACompleteValidRead) {
  const test::TempDir dir;
  SourceOptions options;
  options.cache_dir = dir.path() + "/cache/sub";
  const std::string url = "pipe:printf 'tar bytes'";
  const std::string cached = options.cache_dir + "/" + cache_file_name(url);
  {
    // Read to the end but never marked complete (the reader found it invalid).
    std::unique_ptr<ByteSource> source = open_source(url, options);
    EXPECT_EQ(read_all(*source), "tar bytes");
  }
  EXPECT_FALSE(exists(cached));
  {
    // Marked complete before the end: not published either.
    std::unique_ptr<ByteSource> source = open_source(url, options);
    std::vector<uint8_t> buf(3);
    ASSERT_EQ(source->read(buf.data(), buf.size()), 3u);
    source->mark_complete();
  }
  EXPECT_FALSE(exists(cached));
  {
    std::unique_ptr<ByteSource> source = open_source(url, options);
    EXPECT_EQ(read_all(*source), "tar bytes");
    source->mark_complete();
  }
  ASSERT_TRUE(exists(cached));
  // The next open reads the cached file: it maps, which a pipe never does.
  std::unique_ptr<ByteSource> again = open_source(url, options);
  EXPECT_EQ(again->url(), url);
  EXPECT_NE(again->map_file(), nullptr);
  EXPECT_EQ(read_all(*again), "tar bytes");
  // Nothing but the published entry is left in the cache directory.
  int entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(options.cache_dir)) {
    EXPECT_EQ(entry.path().string(), cached);
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

}  // namespace
}  // namespace chute

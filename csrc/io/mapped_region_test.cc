#include "io/mapped_region.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "io/unique_fd.h"

namespace chute {
namespace {

using test::kSigbusTests;

std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + i % 23);
  return s;
}

UniqueFd open_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  return UniqueFd(fd);
}

size_t page() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }

TEST(MappedRegion, MapsARangeAtAnyOffset) {
  const test::TempDir dir;
  const std::string bytes = pattern(3 * page() + 17);
  const std::string path = dir.write("f", bytes);
  const UniqueFd fd = open_read(path);
  const size_t offset = page() + 5;  // not page-aligned
  MappedRegion region(fd.get(), offset, 1000, path);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(region.data()), 1000), bytes.substr(offset, 1000));
  std::vector<uint8_t> a(10), b(20);
  const CopySpan spans[] = {{a.data(), region.data(), 10}, {b.data(), region.data() + 980, 20}};
  EXPECT_EQ(copy_from_mapping(spans, 2), 2u);
  EXPECT_EQ(std::string(a.begin(), a.end()), bytes.substr(offset, 10));
  EXPECT_EQ(std::string(b.begin(), b.end()), bytes.substr(offset + 980, 20));
}

TEST(MappedRegion, RefusedMappingIsAnIoError) {
  const std::optional<Error> e =
      test::error_from([] { MappedRegion region(-1, 0, 100, "/nowhere/f.h5"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kIo);
  EXPECT_EQ(e->message(), "cannot map 100 bytes at offset 0 of '/nowhere/f.h5': Bad file descriptor");
  EXPECT_EQ(e->os_failure().number, EBADF);
  EXPECT_EQ(e->os_failure().path, "/nowhere/f.h5");
}

TEST(OpenForMapping, FailedOpenCarriesItsErrnoAndPath) {
  const test::TempDir dir;
  const std::string missing = dir.path() + "/gone.bin";
  uint64_t size = 0;
  std::optional<Error> e = test::error_from([&] { open_for_mapping(missing, &size); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kIo);
  EXPECT_EQ(e->message(), "cannot open '" + missing + "': No such file or directory");
  EXPECT_EQ(e->os_failure().number, ENOENT);
  EXPECT_EQ(e->os_failure().path, missing);
  // Root reads a file whatever its mode: the case needs another user.
  if (::geteuid() == 0) GTEST_SKIP() << "runs as root, which no file mode keeps out";
  const std::string locked = dir.write("locked.bin", "0123");
  ASSERT_EQ(::chmod(locked.c_str(), 0), 0);
  e = test::error_from([&] { open_for_mapping(locked, &size); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->os_failure().number, EACCES);
  EXPECT_EQ(e->os_failure().path, locked);
}

TEST(MappedRegion, CopyStopsAtTheFirstSpanWhosePageIsGone) {
  if (!kSigbusTests) GTEST_SKIP() << "SIGBUS handling under ThreadSanitizer";
  const test::TempDir dir;
  const std::string path = dir.write("f", pattern(4 * page()));
  const UniqueFd fd = open_read(path);
  MappedRegion region(fd.get(), 0, 4 * page(), path);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(page() + 1)), 0);
  std::vector<uint8_t> out(3, 0);
  const CopySpan spans[] = {{&out[0], region.data() + 10, 1},
                            {&out[1], region.data() + page(), 1},      // still in the file
                            {&out[2], region.data() + 3 * page(), 1},  // past its new end
                            {&out[2], region.data() + 20, 1}};
  EXPECT_EQ(copy_from_mapping(spans, 4), 2u);
  EXPECT_EQ(out[0], 'a' + 10 % 23);
  // The copy that follows on this thread is guarded afresh.
  const CopySpan first[] = {{&out[0], region.data(), 1}};
  EXPECT_EQ(copy_from_mapping(first, 1), 1u);
  EXPECT_EQ(out[0], 'a');
}

TEST(MappedFile, WholeFileAndItsSize) {
  const test::TempDir dir;
  const std::string bytes = pattern(2 * page() + 3);
  const UniqueFd fd = open_read(dir.write("f", bytes));
  const std::shared_ptr<MappedFile> file = MappedFile::map(fd.get(), bytes.size());
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->size(), bytes.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file->data()), bytes.size()), bytes);
  EXPECT_EQ(file->valid_size(), bytes.size());
  EXPECT_FALSE(file->check_size());
  EXPECT_FALSE(file->truncated());
  file->release(0, bytes.size());  // drops pages from RSS only: the bytes read the same
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file->data()), bytes.size()), bytes);
  EXPECT_EQ(MappedFile::map(fd.get(), 0), nullptr);
}

TEST(MappedFile, ShrunkFileReadsZerosPastItsEndAndSaysSo) {
  if (!kSigbusTests) GTEST_SKIP() << "SIGBUS handling under ThreadSanitizer";
  const test::TempDir dir;
  const std::string bytes = pattern(4 * page());
  const std::string path = dir.write("f", bytes);
  const UniqueFd fd = open_read(path);
  const std::shared_ptr<MappedFile> file = MappedFile::map(fd.get(), bytes.size());
  ASSERT_NE(file, nullptr);
  const uint64_t cut = page() + 100;
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(cut)), 0);
  // A page wholly past the new end: the fault is turned into a zero page,
  // and the valid size drops to that page's start.
  const volatile uint8_t* p = file->data();
  EXPECT_EQ(p[3 * page() + 7], 0);
  EXPECT_EQ(file->valid_size(), 3 * page());
  EXPECT_TRUE(file->truncated());
  // The size check then finds the exact end.
  EXPECT_TRUE(file->check_size());
  EXPECT_EQ(file->valid_size(), cut);
  // What lies before the cut is untouched.
  EXPECT_EQ(p[cut - 1], static_cast<uint8_t>(bytes[cut - 1]));
}

}  // namespace
}  // namespace chute

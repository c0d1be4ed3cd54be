#include "io/range_reader.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/testing.h"

namespace chute {
namespace {

TEST(LocalRangeReader, RefusesAFileThatIsNotTheIndexedOne) {
  test::TempDir dir;
  const std::string path = dir.write("s.tar", "0123456789");
  const auto reader = open_local_range_reader("s.tar", path, ShardIdentity{10, -1, ""});
  uint8_t buf[4];
  reader->read(3, 4, buf);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf), 4), "3456");
  const std::optional<Error> past = test::error_from([&] { reader->read(8, 4, buf); });
  ASSERT_TRUE(past);
  EXPECT_EQ(past->kind(), ErrorKind::kData);
  EXPECT_NE(past->message().find("now ends at offset 10"), std::string::npos) << past->message();
  const std::optional<Error> other =
      test::error_from([&] { open_local_range_reader("s.tar", path, ShardIdentity{11, -1, ""}); });
  ASSERT_TRUE(other);
  EXPECT_NE(other->message().find("changed after it was indexed"), std::string::npos);
}

TEST(LocalRangeReader, AMissingShardCarriesItsErrnoAndPath) {
  test::TempDir dir;
  const std::string path = dir.path() + "/gone.tar";
  const std::optional<Error> e =
      test::error_from([&] { open_local_range_reader("s3://b/gone.tar", path, ShardIdentity{}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kIo);
  EXPECT_EQ(e->message(), "cannot open shard 's3://b/gone.tar': No such file or directory");
  EXPECT_EQ(e->os_failure().number, ENOENT);
  EXPECT_EQ(e->os_failure().path, path);  // the file the call was about, not the url
}

}  // namespace
}  // namespace chute

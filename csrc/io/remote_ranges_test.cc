#include "io/remote_ranges.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/read_cancel.h"
#include "core/testing.h"
#include "io/fetch_queue.h"
#include "io/remote_testing.h"

namespace chute {
namespace {

using test::MemoryStore;

std::string object(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + (i >> 9)) % 251);
  return s;
}

std::shared_ptr<FetchQueue> queue(uint64_t range_bytes) {
  FetchSettings s;
  s.range_bytes = range_bytes;
  s.backoff_s = 0.001;
  s.max_backoff_s = 0.002;
  return std::make_shared<FetchQueue>(s);
}

std::vector<MemoryStore::Seen> ranges_of(const std::vector<MemoryStore::Seen>& seen) {
  std::vector<MemoryStore::Seen> out;
  for (const auto& s : seen) {
    if (s.op == FetchOp::kRange) out.push_back(s);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  return out;
}

TEST(RemoteRanges, NeighboursShareARequestAndFarSpansDoNot) {
  const std::string data = object(400000);
  auto q = queue(1 << 20);
  MemoryStore store(q, data, "\"tag\"");
  RemoteRanges ranges("http://h/o", q);
  EXPECT_EQ(ranges.size(), data.size());
  EXPECT_EQ(ranges.version(), "\"tag\"");
  // Unsorted and overlapping: [100, 150) and [120, 170) and [0, 10) lie
  // within the merge gap of each other; [300000, 300010) does not.
  std::string a(50, '\0'), b(50, '\0'), c(10, '\0'), d(10, '\0');
  const RemoteRanges::Span spans[] = {
      {300000, 10, reinterpret_cast<uint8_t*>(d.data())},
      {100, 50, reinterpret_cast<uint8_t*>(a.data())},
      {0, 10, reinterpret_cast<uint8_t*>(c.data())},
      {120, 50, reinterpret_cast<uint8_t*>(b.data())},
  };
  ranges.read(spans, 4);
  EXPECT_EQ(a, data.substr(100, 50));
  EXPECT_EQ(b, data.substr(120, 50));
  EXPECT_EQ(c, data.substr(0, 10));
  EXPECT_EQ(d, data.substr(300000, 10));
  const auto seen = ranges_of(store.seen());
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].offset, 0u);
  EXPECT_EQ(seen[0].length, 170u);
  EXPECT_EQ(seen[1].offset, 300000u);
  EXPECT_EQ(seen[1].length, 10u);
  EXPECT_EQ(seen[0].if_match, "\"tag\"");  // the object must still be the one opened
  EXPECT_EQ(ranges.ranges_fetched(), 2u);
  EXPECT_EQ(ranges.bytes_fetched(), 180u);
}

TEST(RemoteRanges, LongSpansAreSplitIntoRangesOfRangeBytes) {
  const std::string data = object(10000);
  auto q = queue(1000);
  MemoryStore store(q, data, "W/\"weak\"");
  RemoteRanges ranges("s3://b/o", q);
  std::string out(2500, '\0');
  ranges.read(1234, out.size(), reinterpret_cast<uint8_t*>(out.data()));
  EXPECT_EQ(out, data.substr(1234, 2500));
  const auto seen = ranges_of(store.seen());
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].offset, 1234u);
  EXPECT_EQ(seen[0].length, 1000u);
  EXPECT_EQ(seen[2].offset, 3234u);
  EXPECT_EQ(seen[2].length, 500u);
  for (const auto& s : seen) EXPECT_EQ(s.if_match, "");  // a weak ETag never matches
}

TEST(RemoteRanges, AFailedRangeNamesUrlRangeAndStatus) {
  const std::string data = object(5000);
  auto q = queue(1000);
  MemoryStore store(q, data, "\"t\"");
  RemoteRanges ranges("https://h/x.h5", q);
  store.fail_at(1500, 403);  // the second of the ranges 500, 1500, 2500
  std::string out(3000, '\0');
  const std::optional<Error> e = test::error_from(
      [&] { ranges.read(500, out.size(), reinterpret_cast<uint8_t*>(out.data())); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kIo);
  EXPECT_NE(e->message().find("https://h/x.h5"), std::string::npos) << e->message();
  EXPECT_NE(e->message().find("bytes 1500-2499 of 5000"), std::string::npos) << e->message();
  EXPECT_NE(e->message().find("HTTP 403"), std::string::npos) << e->message();
  // The reader stays usable for other ranges.
  std::string ok(100, '\0');
  ranges.read(0, ok.size(), reinterpret_cast<uint8_t*>(ok.data()));
  EXPECT_EQ(ok, data.substr(0, 100));
}

TEST(RemoteRanges, SpansPastTheEndAreRefusedBeforeAnyRequest) {
  auto q = queue(1000);
  MemoryStore store(q, object(100), "");
  RemoteRanges ranges("gs://b/o", q);
  uint8_t buf[20];
  const std::optional<Error> e = test::error_from([&] { ranges.read(90, 20, buf); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_NE(e->message().find("ends at byte 100"), std::string::npos) << e->message();
  EXPECT_TRUE(ranges_of(store.seen()).empty());
}

TEST(RemoteRanges, AReaderOfAnotherSizeOrVersionThanIndexedIsRefused) {
  auto q = queue(1000);
  MemoryStore store(q, object(100), "\"t\"");
  const std::optional<Error> e = test::error_from(
      [&] { open_remote_range_reader("s3://b/s.tar", q, ShardIdentity{99, -1, ""}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_NE(e->message().find("changed after it was indexed"), std::string::npos);
  const std::optional<Error> other = test::error_from(
      [&] { open_remote_range_reader("s3://b/s.tar", q, ShardIdentity{100, -1, "\"u\""}); });
  ASSERT_TRUE(other);
  EXPECT_EQ(other->kind(), ErrorKind::kData);
  EXPECT_NE(other->message().find("(version \"t\", indexed with \"u\")"), std::string::npos)
      << other->message();
  const auto reader = open_remote_range_reader("s3://b/s.tar", q, ShardIdentity{100, 123, "\"t\""});
  uint8_t buf[3];
  reader->read(10, 3, buf);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf), 3), object(100).substr(10, 3));
}

TEST(RemoteRanges, ClosingTheQueueEndsAWait) {
  auto q = queue(1000);
  // No fetcher answers: the HEAD waits until the queue is closed.
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    q->close();
  });
  const std::optional<Error> e = test::error_from([&] { RemoteRanges("http://h/o", q); });
  closer.join();
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("closed"), std::string::npos) << e->message();
}

TEST(RemoteRanges, AReadStopsWhenItsThreadsCancelFlagIsSet) {
  // What an engine's close() does to a read its worker makes for it: the
  // queue stays open (other engines read through it), nothing answers.
  auto q = queue(1000);
  std::atomic<bool> closing{false};
  std::optional<Error> e;
  std::thread worker([&] {
    const ReadCancelScope scope(&closing);
    e = test::error_from([&] { RemoteRanges("http://h/o", q); });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  closing.store(true);
  worker.join();
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("the engine it read for was closed"), std::string::npos)
      << e->message();
  EXPECT_EQ(current_read_cancel(), nullptr);  // installed on the worker's thread only
}

TEST(ReadCancelScope, InstallsAFlagAndPutsThePreviousOneBack) {
  std::atomic<bool> outer{false}, inner{false};
  EXPECT_EQ(current_read_cancel(), nullptr);
  {
    const ReadCancelScope a(&outer);
    EXPECT_EQ(current_read_cancel(), &outer);
    {
      const ReadCancelScope b(&inner);
      EXPECT_EQ(current_read_cancel(), &inner);
    }
    EXPECT_EQ(current_read_cancel(), &outer);
  }
  EXPECT_EQ(current_read_cancel(), nullptr);
}

}  // namespace
}  // namespace chute

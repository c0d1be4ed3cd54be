#include "hdf5/chunk_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "core/testing.h"

namespace chute::h5 {
namespace {

using namespace std::chrono_literals;
constexpr auto kHangGuard = 30s;
constexpr auto kStillBlocked = 50ms;  // see batching/ordered_results_test.cc

ChunkKey key(uint64_t chunk, uint64_t source = 1) { return ChunkKey{source, chunk}; }

// A loader that makes `size` bytes of `fill` and counts its calls.
ChunkCache::Loader loader(size_t size, uint8_t fill, int* calls) {
  return [=]() {
    *calls += 1;
    return std::vector<uint8_t>(size, fill);
  };
}

TEST(ChunkCache, MissThenHit) {
  ChunkCache cache(1000);
  int calls = 0;
  const ChunkCache::Data a = cache.get(key(1), loader(100, 7, &calls));
  const ChunkCache::Data b = cache.get(key(1), loader(100, 8, &calls));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(a, b);  // the same bytes, not a copy
  EXPECT_EQ((*b)[0], 7);
  const ChunkCacheStats s = cache.stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.bytes, 100u);
  EXPECT_EQ(s.capacity, 1000u);
}

TEST(ChunkCache, KeysDifferBySourceAndChunk) {
  ChunkCache cache(1000);
  int calls = 0;
  cache.get(key(1, 1), loader(10, 1, &calls));
  cache.get(key(1, 2), loader(10, 2, &calls));
  cache.get(key(2, 1), loader(10, 3, &calls));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ((*cache.get(key(1, 2), loader(10, 9, &calls)))[0], 2);
}

TEST(ChunkCache, EvictsTheLeastRecentlyUsedWithinItsBytes) {
  ChunkCache cache(300);
  int calls = 0;
  cache.get(key(1), loader(100, 1, &calls));
  cache.get(key(2), loader(100, 2, &calls));
  cache.get(key(3), loader(100, 3, &calls));
  cache.get(key(1), loader(100, 1, &calls));  // 1 is now more recent than 2
  cache.get(key(4), loader(100, 4, &calls));  // over budget: 2 goes, not 1
  EXPECT_EQ(calls, 4);
  ChunkCacheStats s = cache.stats();
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.bytes, 300u);
  cache.get(key(1), loader(100, 1, &calls));
  cache.get(key(3), loader(100, 3, &calls));
  cache.get(key(4), loader(100, 4, &calls));
  EXPECT_EQ(calls, 4);
  cache.get(key(2), loader(100, 2, &calls));
  EXPECT_EQ(calls, 5);
  s = cache.stats();
  EXPECT_LE(s.bytes, 300u);
}

TEST(ChunkCache, AChunkLargerThanTheCacheIsReturnedButNotKept) {
  ChunkCache cache(100);
  int calls = 0;
  const ChunkCache::Data big = cache.get(key(1), loader(101, 5, &calls));
  EXPECT_EQ(big->size(), 101u);
  cache.get(key(1), loader(101, 5, &calls));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(cache.stats().bytes, 0u);
}

TEST(ChunkCache, AFailedLoadIsNotCached) {
  ChunkCache cache(1000);
  int calls = 0;
  const std::optional<Error> e = test::error_from([&] {
    cache.get(key(1), [&]() -> std::vector<uint8_t> {
      calls += 1;
      CHUTE_CHECK(false, kData, "chunk 1 is corrupt");
      return {};
    });
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "chunk 1 is corrupt");
  const ChunkCache::Data d = cache.get(key(1), loader(10, 1, &calls));
  EXPECT_EQ(calls, 2);  // tried again
  EXPECT_EQ(d->size(), 10u);
}

TEST(ChunkCache, ConcurrentRequestsShareOneLoad) {
  ChunkCache cache(1000);
  std::atomic<int> calls{0};
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  auto slow = [&]() {
    calls.fetch_add(1);
    started.set_value();
    released.wait();
    return std::vector<uint8_t>(10, 42);
  };
  std::future<ChunkCache::Data> first =
      std::async(std::launch::async, [&] { return cache.get(key(1), slow); });
  started.get_future().wait();  // the first request is loading now
  std::future<ChunkCache::Data> second =
      std::async(std::launch::async, [&] { return cache.get(key(1), slow); });
  EXPECT_EQ(second.wait_for(kStillBlocked), std::future_status::timeout)
      << "the second request did not wait for the load in progress";
  release.set_value();
  ASSERT_EQ(first.wait_for(kHangGuard), std::future_status::ready);
  ASSERT_EQ(second.wait_for(kHangGuard), std::future_status::ready);
  const ChunkCache::Data a = first.get();
  EXPECT_EQ(second.get(), a);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(cache.stats().misses, 1u);
}

TEST(ChunkCache, WaitersOfAFailedLoadAllGetItsError) {
  ChunkCache cache(1000);
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  auto failing = [&]() -> std::vector<uint8_t> {
    started.set_value();
    released.wait();
    throw std::runtime_error("disk on fire");
  };
  std::future<void> first = std::async(std::launch::async, [&] { cache.get(key(1), failing); });
  started.get_future().wait();
  int calls = 0;
  std::future<void> second =
      std::async(std::launch::async, [&] { cache.get(key(1), loader(1, 1, &calls)); });
  EXPECT_EQ(second.wait_for(kStillBlocked), std::future_status::timeout);
  release.set_value();
  ASSERT_EQ(first.wait_for(kHangGuard), std::future_status::ready);
  ASSERT_EQ(second.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_THROW(first.get(), std::runtime_error);
  EXPECT_THROW(second.get(), std::runtime_error);
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace chute::h5

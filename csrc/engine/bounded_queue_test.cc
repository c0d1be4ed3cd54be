#include "engine/bounded_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

namespace chute {
namespace {

using namespace std::chrono_literals;

// Hang guard for waits that must end; see ordered_results_test.cc for the
// bounded look at a wait that must not end yet.
constexpr auto kHangGuard = 30s;
constexpr auto kStillBlocked = 50ms;

TEST(BoundedQueue, FirstInFirstOut) {
  BoundedQueue<int> q(4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(q.push(i));
  EXPECT_EQ(q.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q.pop(), std::optional<int>(i));
  EXPECT_EQ(q.size(), 0u);
}

TEST(BoundedQueue, PushWaitsForRoom) {
  BoundedQueue<int> q(2);
  ASSERT_TRUE(q.push(1));
  ASSERT_TRUE(q.push(2));
  std::future<bool> producer = std::async(std::launch::async, [&] { return q.push(3); });
  EXPECT_EQ(producer.wait_for(kStillBlocked), std::future_status::timeout)
      << "pushed past the capacity";
  EXPECT_EQ(q.pop(), std::optional<int>(1));
  ASSERT_EQ(producer.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_TRUE(producer.get());
  EXPECT_EQ(q.pop(), std::optional<int>(2));
  EXPECT_EQ(q.pop(), std::optional<int>(3));
}

TEST(BoundedQueue, CapacityZeroMeansOne) {
  BoundedQueue<int> q(0);
  ASSERT_TRUE(q.push(1));  // would hang with no room at all
  std::future<bool> producer = std::async(std::launch::async, [&] { return q.push(2); });
  EXPECT_EQ(producer.wait_for(kStillBlocked), std::future_status::timeout);
  EXPECT_EQ(q.pop(), std::optional<int>(1));
  ASSERT_EQ(producer.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_EQ(q.pop(), std::optional<int>(2));
}

TEST(BoundedQueue, CloseWakesAWaitingConsumer) {
  BoundedQueue<int> q(2);
  std::future<std::optional<int>> consumer = std::async(std::launch::async, [&] { return q.pop(); });
  EXPECT_EQ(consumer.wait_for(kStillBlocked), std::future_status::timeout);
  q.close();
  ASSERT_EQ(consumer.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_EQ(consumer.get(), std::nullopt);
}

TEST(BoundedQueue, CloseWakesAWaitingProducerAndDropsItsItem) {
  BoundedQueue<int> q(1);
  ASSERT_TRUE(q.push(1));
  std::future<bool> producer = std::async(std::launch::async, [&] { return q.push(2); });
  EXPECT_EQ(producer.wait_for(kStillBlocked), std::future_status::timeout);
  q.close();
  ASSERT_EQ(producer.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_FALSE(producer.get());
  // What was queued before the close is still delivered, then the end.
  EXPECT_EQ(q.pop(), std::optional<int>(1));
  EXPECT_EQ(q.pop(), std::nullopt);
}

TEST(BoundedQueue, PushAfterCloseFails) {
  BoundedQueue<std::unique_ptr<int>> q(4);
  q.close();
  EXPECT_FALSE(q.push(std::make_unique<int>(1)));
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(q.pop(), std::nullopt);
}

TEST(BoundedQueue, ManyProducersManyConsumersEveryItemOnce) {
  constexpr int kProducers = 4, kConsumers = 3, kPerProducer = 5000;
  BoundedQueue<int> q(8);
  std::vector<std::future<std::vector<int>>> consumers;
  for (int c = 0; c < kConsumers; ++c) {
    consumers.push_back(std::async(std::launch::async, [&] {
      std::vector<int> got;
      while (std::optional<int> v = q.pop()) got.push_back(*v);
      return got;
    }));
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&q, p] {
      for (int i = 0; i < kPerProducer; ++i) q.push(p * kPerProducer + i);
    });
  }
  for (std::thread& t : producers) t.join();
  q.close();
  std::vector<int> all;
  for (auto& c : consumers) {
    ASSERT_EQ(c.wait_for(kHangGuard), std::future_status::ready);
    std::vector<int> got = c.get();
    // One producer's items reach any one consumer in the order pushed.
    for (int p = 0; p < kProducers; ++p) {
      std::vector<int> mine;
      for (int v : got) {
        if (v / kPerProducer == p) mine.push_back(v);
      }
      EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
    }
    all.insert(all.end(), got.begin(), got.end());
  }
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), static_cast<size_t>(kProducers * kPerProducer));
  for (int i = 0; i < kProducers * kPerProducer; ++i) ASSERT_EQ(all[static_cast<size_t>(i)], i);
}

}  // namespace
}  // namespace chute

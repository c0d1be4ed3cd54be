#include "pipeline/stream_counters.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "pipeline/sample_testing.h"

namespace chute {
namespace {

TEST(StreamCounters, FillsWhatTheThreadsCounted) {
  StreamCounters counters;
  counters.shard_opened();
  counters.shard_opened();
  counters.sample_read(test::encoded_sample("a", {{"txt", "12345"}}));
  counters.sample_read(test::encoded_sample("b", {{"txt", "123"}, {"cls", "7"}}));
  counters.read_time(40);
  counters.read_time(2);
  counters.batch_submitted(2);
  counters.shuffle(300, 500, 6);
  EngineStats s;
  s.queued_batches = 9;  // not the counters' part
  counters.fill(s);
  EXPECT_EQ(s.shards_opened, 2u);
  EXPECT_EQ(s.samples_read, 2u);
  EXPECT_EQ(s.encoded_bytes, 9u);
  EXPECT_EQ(s.read_ns, 42u);
  EXPECT_EQ(s.batches_submitted, 1u);
  EXPECT_EQ(s.samples_batched, 2u);
  EXPECT_EQ(s.shuffle_bytes, 300u);
  EXPECT_EQ(s.shuffle_peak_bytes, 500u);
  EXPECT_EQ(s.shuffle_peak_samples, 6u);
  EXPECT_EQ(s.queued_batches, 9);
}

TEST(StreamCounters, ShufflePeaksAreTheLargestReported) {
  StreamCounters counters;
  counters.shuffle(100, 800, 3);
  counters.shuffle(50, 200, 9);
  EngineStats s;
  counters.fill(s);
  EXPECT_EQ(s.shuffle_bytes, 50u);  // now, as reported last
  EXPECT_EQ(s.shuffle_peak_bytes, 800u);
  EXPECT_EQ(s.shuffle_peak_samples, 9u);
}

TEST(StreamCounters, ThreadsCountTogether) {
  StreamCounters counters;
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 4; ++t) {
    threads.emplace_back([&counters, t] {
      for (uint64_t i = 0; i < 1000; ++i) {
        counters.batch_submitted(3);
        counters.shuffle(i, t * 1000 + i, i);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EngineStats s;
  counters.fill(s);
  EXPECT_EQ(s.batches_submitted, 4000u);
  EXPECT_EQ(s.samples_batched, 12000u);
  EXPECT_EQ(s.shuffle_peak_bytes, 3999u);
  EXPECT_EQ(s.shuffle_peak_samples, 999u);
}

}  // namespace
}  // namespace chute

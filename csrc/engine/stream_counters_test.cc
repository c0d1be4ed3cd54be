#include "engine/stream_counters.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "sources/sample_testing.h"

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
  StreamCounters::ShuffleLevel last;
  counters.shuffle(last, {300, 4}, 500, 6);
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

TEST(StreamCounters, ShuffleFiguresAddTheStreamsUp) {
  StreamCounters counters;
  StreamCounters::ShuffleLevel a, b;
  counters.shuffle(a, {100, 3}, 800, 3);  // a buffer that was larger before
  counters.shuffle(b, {50, 9}, 50, 9);
  EngineStats s;
  counters.fill(s);
  EXPECT_EQ(s.shuffle_bytes, 150u);
  EXPECT_EQ(s.shuffle_peak_bytes, 800u);  // one buffer's own peak
  EXPECT_EQ(s.shuffle_peak_samples, 12u);  // the total at b's report
  counters.shuffle(a, {700, 20}, 800, 20);
  counters.shuffle(b, {0, 0}, 50, 9);  // drained
  counters.fill(s);
  EXPECT_EQ(s.shuffle_bytes, 700u);
  EXPECT_EQ(s.shuffle_peak_bytes, 800u);
  EXPECT_EQ(s.shuffle_peak_samples, 29u);  // 20 + 9 at a's report
  EXPECT_EQ(a.bytes, 700u);
  EXPECT_EQ(b.samples, 0u);
}

TEST(StreamCounters, ThreadsCountTogether) {
  StreamCounters counters;
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 4; ++t) {
    threads.emplace_back([&counters, t] {
      StreamCounters::ShuffleLevel last;
      for (uint64_t i = 0; i < 1000; ++i) {
        counters.batch_submitted(3);
        counters.shuffle(last, {i, i}, t * 1000 + i, i);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EngineStats s;
  counters.fill(s);
  EXPECT_EQ(s.batches_submitted, 4000u);
  EXPECT_EQ(s.samples_batched, 12000u);
  EXPECT_EQ(s.shuffle_bytes, 4u * 999u);  // each stream's last report, added up
  EXPECT_EQ(s.shuffle_peak_bytes, 3999u);
}

}  // namespace
}  // namespace chute

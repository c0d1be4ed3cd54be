#include "schedule/shuffle_replay.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "schedule/shuffle_buffer.h"

namespace chute {
namespace {

// What a stream thread does with its buffer (stream_engine.cc), on ints.
std::vector<int64_t> stream(const ShuffleReplaySpec& spec, const std::vector<uint64_t>& bytes) {
  ShuffleBuffer<int64_t> buffer(spec.capacity, spec.initial, spec.max_bytes,
                                stream_shuffle_seed(spec.plan_seed, spec.epoch, spec.stream));
  std::vector<int64_t> out;
  auto emit = [&](int64_t v) {
    out.push_back(v);
    return true;
  };
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (buffer.enabled()) {
      buffer.feed(static_cast<int64_t>(i), bytes[i], emit);
    } else {
      emit(static_cast<int64_t>(i));
    }
  }
  int64_t v = 0;
  while (buffer.pop(&v)) out.push_back(v);
  return out;
}

std::vector<uint64_t> sizes(size_t n) {
  std::vector<uint64_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = 10 + (i * 7919) % 90;
  return out;
}

TEST(ShuffleReplay, EveryPrefixIsTheStreamsOwnOutput) {
  ShuffleReplaySpec spec;
  spec.capacity = 20;
  spec.initial = 5;
  spec.plan_seed = 3;
  spec.epoch = 2;
  spec.stream = 0;
  for (size_t max_bytes : {size_t{1} << 30, size_t{300}}) {
    spec.max_bytes = max_bytes;
    const std::vector<uint64_t> b = sizes(100);
    const std::vector<int64_t> full = stream(spec, b);
    ASSERT_EQ(full.size(), 100u);
    for (size_t outputs : {size_t{0}, size_t{1}, size_t{37}, size_t{100}, size_t{150}}) {
      const std::vector<int64_t> replay = replay_shuffle(spec, b, outputs);
      const size_t expect = std::min(outputs, full.size());
      ASSERT_EQ(replay.size(), expect);
      EXPECT_TRUE(std::equal(replay.begin(), replay.end(), full.begin())) << outputs;
    }
  }
}

TEST(ShuffleReplay, TheSeedNamesTheOrder) {
  ShuffleReplaySpec a;
  a.capacity = 30;
  a.initial = 30;
  ShuffleReplaySpec b = a;
  b.stream = 1;
  const std::vector<uint64_t> s = sizes(60);
  EXPECT_NE(replay_shuffle(a, s, 60), replay_shuffle(b, s, 60));
  EXPECT_EQ(replay_shuffle(a, s, 60), replay_shuffle(a, s, 60));
}

TEST(ShuffleReplay, WithoutABufferSamplesLeaveInOrder) {
  ShuffleReplaySpec spec;
  std::vector<int64_t> expect(7);
  std::iota(expect.begin(), expect.end(), 0);
  EXPECT_EQ(replay_shuffle(spec, sizes(10), 7), expect);
}

}  // namespace
}  // namespace chute

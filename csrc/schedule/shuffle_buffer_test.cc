#include "schedule/shuffle_buffer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

namespace chute {
namespace {

// What the stream threads do with the buffer: push each sample, pop while
// the buffer is over its byte budget, drain at the end of the stream.
struct Trace {
  std::vector<int> out;
  size_t max_size = 0;        // after each step
  size_t max_bytes = 0;       // after each step
  size_t max_held_bytes = 0;  // sum of the sizes of the items held, after each step
};

Trace run(ShuffleBuffer<int>& buffer, int n, size_t (*bytes_of)(int)) {
  Trace t;
  std::vector<size_t> sizes(static_cast<size_t>(n));
  std::set<int> held;
  auto held_bytes = [&] {
    size_t sum = 0;
    for (int v : held) sum += sizes[static_cast<size_t>(v)];
    return sum;
  };
  auto take = [&](int v) {
    t.out.push_back(v);
    EXPECT_EQ(held.erase(v), 1u) << "item " << v << " came out but was not held";
  };
  for (int i = 0; i < n; ++i) {
    sizes[static_cast<size_t>(i)] = bytes_of(i);
    held.insert(i);
    int out = -1;
    if (buffer.push(i, bytes_of(i), &out)) take(out);
    while (buffer.over_budget() && buffer.pop(&out)) take(out);
    EXPECT_EQ(buffer.size(), held.size());
    EXPECT_EQ(buffer.bytes(), held_bytes());
    t.max_size = std::max(t.max_size, buffer.size());
    t.max_bytes = std::max(t.max_bytes, buffer.bytes());
    t.max_held_bytes = std::max(t.max_held_bytes, held_bytes());
  }
  int out = -1;
  while (buffer.pop(&out)) take(out);
  EXPECT_TRUE(held.empty());
  EXPECT_EQ(buffer.bytes(), 0u);
  return t;
}

size_t ten_bytes(int) { return 10; }

std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(ShuffleBuffer, CapacityZeroPassesSamplesStraightThrough) {
  ShuffleBuffer<int> buffer(0, 100, 1 << 20, 7);
  EXPECT_FALSE(buffer.enabled());
  for (int i = 0; i < 5; ++i) {
    int out = -1;
    ASSERT_TRUE(buffer.push(i, 10, &out));
    EXPECT_EQ(out, i);
    EXPECT_EQ(buffer.size(), 0u);
  }
}

TEST(ShuffleBuffer, FillsToInitialThenTakesTwoInForEachOutUntilFull) {
  ShuffleBuffer<int> buffer(8, 3, 1 << 20, 1);
  EXPECT_TRUE(buffer.enabled());
  // Per push: whether a sample left, and how many are held afterwards.
  const std::vector<bool> emits = {false, false, false, true, false, true, false,
                                   true,  false, true,  false, true,  true,  true};
  const std::vector<size_t> held = {1, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 7, 7};
  for (size_t i = 0; i < emits.size(); ++i) {
    int out = -1;
    EXPECT_EQ(buffer.push(static_cast<int>(i), 1, &out), emits[i]) << "push " << i;
    EXPECT_EQ(buffer.size(), held[i]) << "push " << i;
  }
  EXPECT_EQ(buffer.peak_items(), 8u);
}

TEST(ShuffleBuffer, InitialAboveCapacityMeansCapacity) {
  ShuffleBuffer<int> buffer(4, 1000, 1 << 20, 1);
  int out = -1;
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(buffer.push(i, 1, &out));
  EXPECT_TRUE(buffer.push(3, 1, &out));
  EXPECT_EQ(buffer.size(), 3u);
}

TEST(ShuffleBuffer, NothingLeavesBeforeInitialSamplesAreHeld) {
  for (size_t initial : {1u, 2u, 17u, 64u}) {
    ShuffleBuffer<int> buffer(64, initial, 1 << 20, 3);
    int out = -1;
    size_t pushes = 0;
    while (!buffer.push(static_cast<int>(pushes), 1, &out)) ++pushes;
    EXPECT_GE(pushes + 1, initial) << "initial " << initial;
    EXPECT_GE(buffer.size() + 1, initial) << "initial " << initial;
  }
}

TEST(ShuffleBuffer, HoldsAtMostCapacitySamples) {
  ShuffleBuffer<int> buffer(50, 10, 1 << 30, 11);
  const Trace t = run(buffer, 1000, ten_bytes);
  EXPECT_LE(t.max_size, 50u);
  EXPECT_EQ(buffer.peak_items(), 50u);  // it does fill up
}

TEST(ShuffleBuffer, StaysWithinItsByteBudget) {
  // Samples of 1 to 100 bytes, room for 10k samples but only 1000 bytes.
  ShuffleBuffer<int> buffer(10000, 100, 1000, 5);
  const Trace t = run(buffer, 5000, [](int i) { return static_cast<size_t>(1 + (i * 37) % 100); });
  EXPECT_LE(t.max_bytes, 1000u);
  EXPECT_LE(t.max_held_bytes, 1000u);
  // The bytes, not the sample count, bounded it.
  EXPECT_LT(t.max_size, 100u);
  // Between a push and the pops after it the buffer may hold one sample more.
  EXPECT_LE(buffer.peak_bytes(), 1000u + 100u);
  EXPECT_GT(buffer.peak_bytes(), 900u);
}

TEST(ShuffleBuffer, ASampleLargerThanTheBudgetPassesThrough) {
  ShuffleBuffer<int> buffer(100, 1, 1000, 5);
  int out = -1;
  EXPECT_TRUE(buffer.push(0, 5000, &out));  // over the budget: out at once
  EXPECT_EQ(out, 0);
  EXPECT_FALSE(buffer.over_budget());
  EXPECT_EQ(buffer.bytes(), 0u);
}

TEST(ShuffleBuffer, EverySampleComesOutExactlyOnce) {
  ShuffleBuffer<int> buffer(64, 16, 1 << 20, 2024);
  const Trace t = run(buffer, 1000, ten_bytes);
  std::vector<int> sorted = t.out;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota(1000));
  EXPECT_NE(t.out, iota(1000)) << "not shuffled";
}

TEST(ShuffleBuffer, SameSeedSameOrderOtherSeedOtherOrder) {
  ShuffleBuffer<int> a(64, 16, 1 << 20, 99);
  ShuffleBuffer<int> b(64, 16, 1 << 20, 99);
  ShuffleBuffer<int> c(64, 16, 1 << 20, 100);
  const std::vector<int> out_a = run(a, 500, ten_bytes).out;
  EXPECT_EQ(run(b, 500, ten_bytes).out, out_a);
  EXPECT_NE(run(c, 500, ten_bytes).out, out_a);
}

TEST(ShuffleBuffer, DrainsInRandomOrder) {
  // A buffer that never fills: everything leaves in the drain.
  ShuffleBuffer<int> buffer(1000, 1000, 1 << 20, 8);
  const Trace t = run(buffer, 200, ten_bytes);
  ASSERT_EQ(t.out.size(), 200u);
  EXPECT_NE(t.out, iota(200));
  std::vector<int> reversed = iota(200);
  std::reverse(reversed.begin(), reversed.end());
  EXPECT_NE(t.out, reversed);
}

TEST(ShuffleBuffer, FirstSampleOutVariesWithTheSeed) {
  std::set<int> firsts;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    ShuffleBuffer<int> buffer(32, 32, 1 << 20, seed);
    int out = -1;
    int i = 0;
    while (!buffer.push(i, 1, &out)) ++i;
    firsts.insert(out);
  }
  // 50 uniform draws from 32: far more than a handful of distinct values.
  EXPECT_GT(firsts.size(), 10u);
}

TEST(ShuffleBuffer, MovesItemsWithoutCopying) {
  ShuffleBuffer<std::unique_ptr<int>> buffer(4, 2, 1 << 20, 3);
  std::vector<int> out_values;
  std::unique_ptr<int> out;
  for (int i = 0; i < 10; ++i) {
    if (buffer.push(std::make_unique<int>(i), 8, &out)) out_values.push_back(*out);
  }
  while (buffer.pop(&out)) out_values.push_back(*out);
  std::sort(out_values.begin(), out_values.end());
  EXPECT_EQ(out_values, iota(10));
}

}  // namespace
}  // namespace chute

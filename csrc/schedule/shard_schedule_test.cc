#include "schedule/shard_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

namespace chute {
namespace {

struct Draw {
  uint32_t shard;
  int64_t pass;
  bool operator==(const Draw& o) const { return shard == o.shard && pass == o.pass; }
};

// Up to `limit` shards of the schedule, with their passes.
std::vector<Draw> take(const ShardScheduleSpec& spec, size_t limit) {
  ShardSchedule schedule(spec);
  std::vector<Draw> out;
  Draw d{};
  while (out.size() < limit && schedule.next(&d.shard, &d.pass)) out.push_back(d);
  return out;
}

std::vector<uint32_t> shards_of(const std::vector<Draw>& draws) {
  std::vector<uint32_t> out;
  for (const Draw& d : draws) out.push_back(d.shard);
  return out;
}

// One stream's shards in one pass (the schedule repeating when it must).
std::vector<uint32_t> pass_of(ShardScheduleSpec spec, int64_t pass) {
  spec.repeat = true;
  std::vector<uint32_t> out;
  for (const Draw& d : take(spec, 1000)) {
    if (d.pass == pass) out.push_back(d.shard);
    if (d.pass > pass) break;
  }
  return out;
}

ShardScheduleSpec spec(size_t shards, size_t stream, size_t streams, bool shuffle,
                       uint64_t seed = 7, int64_t epoch = 0) {
  ShardScheduleSpec s;
  s.num_shards = shards;
  s.stream = stream;
  s.num_streams = streams;
  s.shuffle = shuffle;
  s.seed = seed;
  s.epoch = epoch;
  return s;
}

TEST(ShardSchedule, WithoutShufflingStreamsTakeEveryNthShard) {
  EXPECT_EQ(shards_of(take(spec(10, 0, 1, false), 100)),
            (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(shards_of(take(spec(10, 0, 3, false), 100)), (std::vector<uint32_t>{0, 3, 6, 9}));
  EXPECT_EQ(shards_of(take(spec(10, 1, 3, false), 100)), (std::vector<uint32_t>{1, 4, 7}));
  EXPECT_EQ(shards_of(take(spec(10, 2, 3, false), 100)), (std::vector<uint32_t>{2, 5, 8}));
  for (const Draw& d : take(spec(10, 1, 3, false), 100)) EXPECT_EQ(d.pass, 0);
}

TEST(ShardSchedule, WithoutRepeatTheStreamEndsAndStaysEnded) {
  ShardSchedule schedule(spec(3, 0, 1, false));
  uint32_t shard = 99;
  int64_t pass = 99;
  for (uint32_t expected = 0; expected < 3; ++expected) {
    ASSERT_TRUE(schedule.next(&shard, &pass));
    EXPECT_EQ(shard, expected);
  }
  EXPECT_FALSE(schedule.next(&shard, &pass));
  EXPECT_FALSE(schedule.next(&shard, &pass));
}

TEST(ShardSchedule, AStreamBeyondTheShardsGetsNone) {
  EXPECT_TRUE(take(spec(2, 2, 4, false), 10).empty());
  EXPECT_TRUE(take(spec(2, 3, 4, true), 10).empty());
  EXPECT_TRUE(take(spec(0, 0, 1, true), 10).empty());
  ShardScheduleSpec repeating = spec(2, 3, 4, false);
  repeating.repeat = true;  // nothing to repeat: still ends
  EXPECT_TRUE(take(repeating, 10).empty());
  repeating.resampled = true;
  EXPECT_TRUE(take(repeating, 10).empty());
}

TEST(ShardSchedule, TheSameSettingsGiveTheSameOrder) {
  ShardScheduleSpec s = spec(50, 1, 3, true, 1234, 5);
  s.repeat = true;
  const std::vector<Draw> a = take(s, 200);
  const std::vector<Draw> b = take(s, 200);
  ASSERT_EQ(a.size(), 200u);
  EXPECT_EQ(a, b);
}

TEST(ShardSchedule, ShufflingPermutesTheShards) {
  const std::vector<uint32_t> order = shards_of(take(spec(40, 0, 1, true), 100));
  std::vector<uint32_t> identity(40);
  std::iota(identity.begin(), identity.end(), 0u);
  EXPECT_NE(order, identity);
  std::vector<uint32_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, identity);
}

TEST(ShardSchedule, TheSeedAndTheEpochChangeTheOrder) {
  const std::vector<uint32_t> base = shards_of(take(spec(40, 0, 1, true, 1, 0), 100));
  EXPECT_NE(shards_of(take(spec(40, 0, 1, true, 2, 0), 100)), base);
  EXPECT_NE(shards_of(take(spec(40, 0, 1, true, 1, 1), 100)), base);
}

// Every pass of every epoch: the streams' shares are disjoint and together
// hold every shard once, however many streams split them.
TEST(ShardSchedule, StreamsAreDisjointAndCoverEveryShardInEachPass) {
  constexpr size_t kShards = 23;
  for (bool shuffle : {false, true}) {
    for (size_t streams : {1, 2, 4, 5, 23}) {
      for (int64_t pass = 0; pass < 3; ++pass) {
        SCOPED_TRACE(testing::Message() << "shuffle " << shuffle << ", " << streams
                                        << " streams, pass " << pass);
        std::multiset<uint32_t> all;
        for (size_t s = 0; s < streams; ++s) {
          const std::vector<uint32_t> mine = pass_of(spec(kShards, s, streams, shuffle, 99, 2), pass);
          // Shares differ by at most one shard.
          EXPECT_GE(mine.size(), kShards / streams);
          EXPECT_LE(mine.size(), (kShards + streams - 1) / streams);
          all.insert(mine.begin(), mine.end());
        }
        ASSERT_EQ(all.size(), kShards);
        uint32_t expected = 0;
        for (uint32_t shard : all) EXPECT_EQ(shard, expected++);  // each exactly once
      }
    }
  }
}

TEST(ShardSchedule, RepeatingCountsPassesAndShufflesEachOneAfresh) {
  ShardScheduleSpec s = spec(30, 0, 1, true, 5);
  s.repeat = true;
  const std::vector<Draw> draws = take(s, 90);
  ASSERT_EQ(draws.size(), 90u);
  for (size_t i = 0; i < draws.size(); ++i) EXPECT_EQ(draws[i].pass, static_cast<int64_t>(i / 30));
  const std::vector<uint32_t> p0 = pass_of(s, 0);
  const std::vector<uint32_t> p1 = pass_of(s, 1);
  const std::vector<uint32_t> p2 = pass_of(s, 2);
  EXPECT_NE(p0, p1);
  EXPECT_NE(p1, p2);
  EXPECT_EQ(std::set<uint32_t>(p0.begin(), p0.end()), std::set<uint32_t>(p1.begin(), p1.end()));
}

TEST(ShardSchedule, ANextPassAskedForAtTheEndIsTheOneRepeatingWouldGive) {
  const ShardScheduleSpec s = spec(9, 1, 2, true, 5, 3);
  ShardSchedule schedule(s);
  Draw d{};
  std::vector<uint32_t> first;
  while (schedule.next(&d.shard, &d.pass)) first.push_back(d.shard);
  EXPECT_EQ(first, pass_of(s, 0));
  for (int64_t pass = 1; pass <= 2; ++pass) {
    schedule.next_pass();
    std::vector<uint32_t> again;
    while (schedule.next(&d.shard, &d.pass)) {
      EXPECT_EQ(d.pass, pass);
      again.push_back(d.shard);
    }
    EXPECT_EQ(again, pass_of(s, pass));
  }
}

TEST(ShardSchedule, RepeatingWithoutShufflingRepeatsTheSameSplit) {
  ShardScheduleSpec s = spec(7, 1, 2, false);
  s.repeat = true;
  const std::vector<Draw> draws = take(s, 9);
  const std::vector<Draw> expected = {{1, 0}, {3, 0}, {5, 0}, {1, 1}, {3, 1},
                                      {5, 1}, {1, 2}, {3, 2}, {5, 2}};
  EXPECT_EQ(draws, expected);
}

TEST(ShardSchedule, ResamplingDrawsFromTheStreamsShareForever) {
  ShardScheduleSpec s = spec(12, 1, 3, true, 42);
  s.resampled = true;
  const std::vector<Draw> draws = take(s, 600);
  ASSERT_EQ(draws.size(), 600u);  // never ends
  // The stream's share is pass 0's split of the shuffled list.
  ShardScheduleSpec once = s;
  once.resampled = false;
  const std::vector<uint32_t> share = shards_of(take(once, 100));
  ASSERT_EQ(share.size(), 4u);
  std::set<uint32_t> seen;
  for (const Draw& d : draws) {
    EXPECT_EQ(d.pass, 0);
    EXPECT_NE(std::find(share.begin(), share.end(), d.shard), share.end()) << d.shard;
    seen.insert(d.shard);
  }
  // With replacement: 600 draws from 4 shards repeat shards, and (for this
  // seed) reach every one of them.
  EXPECT_EQ(seen, std::set<uint32_t>(share.begin(), share.end()));
  EXPECT_EQ(take(s, 600), draws);  // deterministic
}

TEST(ShardSchedule, StreamsResampleIndependently) {
  // Two streams drawing the same positions of their own shares would read
  // in lockstep; each draws its own sequence.
  std::vector<std::vector<size_t>> positions;
  for (size_t stream : {0, 1}) {
    ShardScheduleSpec s = spec(8, stream, 2, false, 42);
    s.resampled = true;
    std::vector<size_t> mine;
    for (const Draw& d : take(s, 64)) mine.push_back(d.shard / 2);  // position in the share
    positions.push_back(mine);
  }
  EXPECT_NE(positions[0], positions[1]);
}

TEST(ShardSchedule, EveryShardIsAsLikelyAtEveryPosition) {
  // Over 4000 seeds (fixed, so the counts are too), each of 4 shards lands in
  // each position about 1000 times; a skewed shuffle leaves some far off.
  constexpr size_t kShards = 4;
  std::vector<std::vector<int>> count(kShards, std::vector<int>(kShards, 0));
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    const std::vector<uint32_t> order = shards_of(take(spec(kShards, 0, 1, true, seed), 10));
    ASSERT_EQ(order.size(), kShards);
    for (size_t pos = 0; pos < kShards; ++pos) ++count[pos][order[pos]];
  }
  for (size_t pos = 0; pos < kShards; ++pos) {
    for (size_t shard = 0; shard < kShards; ++shard) {
      EXPECT_GT(count[pos][shard], 850) << "shard " << shard << " at position " << pos;
      EXPECT_LT(count[pos][shard], 1150) << "shard " << shard << " at position " << pos;
    }
  }
}

}  // namespace
}  // namespace chute

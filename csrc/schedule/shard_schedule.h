// The shards one logical stream reads, in order: its share of the url list
// (one permutation per epoch and pass for all streams when shuffling, so
// streams stay disjoint), once, or pass after pass when repeating (or when
// its reader asks for the next pass), or drawn with replacement forever when
// resampling. It depends only on these settings, never on threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/random.h"

namespace chute {

struct ShardScheduleSpec {
  size_t num_shards = 0;
  size_t stream = 0;       // this stream
  size_t num_streams = 1;  // streams sharing the shards
  bool shuffle = false;
  bool repeat = false;
  bool resampled = false;
  uint64_t seed = 0;
  int64_t epoch = 0;
};

class ShardSchedule {
 public:
  explicit ShardSchedule(const ShardScheduleSpec& spec);

  // The next shard and the pass over the shard list it belongs to (0 when
  // resampling); false once the stream has no more.
  bool next(uint32_t* shard, int64_t* pass);

  // Begins the next pass over the shard list once next() returned false at
  // the end of one: its shards are those a repeating schedule gives that
  // pass. A reader that must finish a pass before it reads another (the
  // engine's even batch counts, StreamPlan::repeat_to_limit) asks for it.
  void next_pass();

 private:
  std::vector<uint32_t> order(int64_t pass) const;

  const ShardScheduleSpec spec_;
  Rng resample_rng_;
  int64_t pass_ = 0;
  size_t position_ = 0;
  std::vector<uint32_t> order_;
};

}  // namespace chute

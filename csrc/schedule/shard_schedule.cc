#include "schedule/shard_schedule.h"

#include <numeric>
#include <utility>

namespace chute {

ShardSchedule::ShardSchedule(const ShardScheduleSpec& spec)
    : spec_(spec),
      resample_rng_(derive_seed({spec.seed, static_cast<uint64_t>(spec.epoch),
                                 static_cast<uint64_t>(spec.stream), 0x5245534dULL})),
      order_(order(0)) {}

std::vector<uint32_t> ShardSchedule::order(int64_t pass) const {
  std::vector<uint32_t> all(spec_.num_shards);
  std::iota(all.begin(), all.end(), 0u);
  if (spec_.shuffle) {
    Rng rng(derive_seed({spec_.seed, static_cast<uint64_t>(spec_.epoch),
                         static_cast<uint64_t>(pass), 0x5348415244ULL}));
    for (size_t i = all.size(); i > 1; --i) std::swap(all[i - 1], all[rng.below(i)]);
  }
  std::vector<uint32_t> mine;
  for (size_t i = spec_.stream; i < all.size(); i += spec_.num_streams) mine.push_back(all[i]);
  return mine;
}

bool ShardSchedule::next(uint32_t* shard, int64_t* pass) {
  if (order_.empty()) return false;
  if (spec_.resampled) {
    *shard = order_[resample_rng_.below(order_.size())];
    *pass = 0;
    return true;
  }
  if (position_ == order_.size()) {
    if (!spec_.repeat) return false;
    next_pass();
  }
  *shard = order_[position_++];
  *pass = pass_;
  return true;
}

void ShardSchedule::next_pass() {
  order_ = order(++pass_);
  position_ = 0;
}

}  // namespace chute

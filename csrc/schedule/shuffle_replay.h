// A stream's shuffle buffer replayed on sample positions instead of samples:
// which of the samples a stream read have left its buffer after its first
// `outputs` outputs. The buffer is the engine's own (same class, same seed,
// same feeding: ShuffleBuffer::feed), so the replay is exact as long as the
// stream read the samples given here, in this order, with these encoded
// sizes. An elastic resume uses it to know what each rank had delivered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace chute {

struct ShuffleReplaySpec {
  size_t capacity = 0;  // 0: no shuffling, samples leave in order
  size_t initial = 0;
  size_t max_bytes = size_t{1} << 30;
  uint64_t plan_seed = 0;  // StreamPlan::seed
  int64_t epoch = 0;
  uint64_t stream = 0;
};

// Positions (into `bytes`, the encoded size of each sample the stream reads,
// in reading order) of its first `outputs` outputs, in the order they leave;
// fewer when the stream has fewer samples.
std::vector<int64_t> replay_shuffle(const ShuffleReplaySpec& spec,
                                    const std::vector<uint64_t>& bytes, size_t outputs);

}  // namespace chute

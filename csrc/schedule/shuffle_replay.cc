#include "schedule/shuffle_replay.h"

#include <algorithm>

#include "schedule/shuffle_buffer.h"

namespace chute {

std::vector<int64_t> replay_shuffle(const ShuffleReplaySpec& spec,
                                    const std::vector<uint64_t>& bytes, size_t outputs) {
  std::vector<int64_t> out;
  out.reserve(std::min(outputs, bytes.size()));
  ShuffleBuffer<int64_t> buffer(spec.capacity, spec.initial, spec.max_bytes,
                                stream_shuffle_seed(spec.plan_seed, spec.epoch, spec.stream));
  auto emit = [&](int64_t position) {
    out.push_back(position);
    return out.size() < outputs;
  };
  if (outputs == 0) return out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int64_t position = static_cast<int64_t>(i);
    const size_t size = static_cast<size_t>(bytes[i]);
    const bool more = buffer.enabled() ? buffer.feed(position, size, emit) : emit(position);
    if (!more) return out;
  }
  int64_t position = 0;
  while (buffer.pop(&position)) {
    if (!emit(position)) return out;
  }
  return out;
}

}  // namespace chute

#include "schedule/mix_schedule.h"

#include <algorithm>

#include "core/error.h"

namespace chute {

namespace {

using Wide = __int128;

// One period of the chairman assignment, positions [0, stop).
std::vector<int32_t> one_period(const std::vector<int64_t>& counts, int64_t period, int64_t stop) {
  std::vector<int32_t> active;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > 0) active.push_back(static_cast<int32_t>(i));
  }
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(stop));
  if (active.size() == 1) {
    out.assign(static_cast<size_t>(stop), active[0]);
    return out;
  }
  // sigma = 1 - 1/d with d = 2k - 2: at time t, source i may take the next
  // position once t * n_i / n >= taken_i + 1 - sigma (it would not get ahead
  // by sigma or more), and of those the one whose deadline
  // (taken_i + sigma) * n / n_i comes first does (ties: the lower index).
  const Wide d = 2 * static_cast<Wide>(active.size()) - 2;
  std::vector<int64_t> taken(counts.size(), 0);
  for (int64_t t = 1; t <= stop; ++t) {
    int32_t best = -1;
    for (int32_t i : active) {
      const Wide n_i = counts[static_cast<size_t>(i)];
      const Wide s_i = taken[static_cast<size_t>(i)];
      if (d * n_i * t < static_cast<Wide>(period) * (d * s_i + 1)) continue;
      if (best >= 0) {
        const Wide n_b = counts[static_cast<size_t>(best)];
        const Wide s_b = taken[static_cast<size_t>(best)];
        if ((d * s_i + d - 1) * n_b >= (d * s_b + d - 1) * n_i) continue;
      }
      best = i;
    }
    // Tijdeman's theorem: some source is always eligible.
    CHUTE_CHECK(best >= 0, kUsage, "mix schedule found no source for position " << t - 1);
    taken[static_cast<size_t>(best)] += 1;
    out.push_back(best);
  }
  return out;
}

}  // namespace

std::vector<int32_t> mix_schedule(const std::vector<int64_t>& counts, int64_t begin, int64_t end) {
  CHUTE_CHECK(0 <= begin && begin <= end, kUsage,
              "mix schedule positions [" << begin << ", " << end << ") are not a range");
  int64_t period = 0;
  for (int64_t c : counts) {
    CHUTE_CHECK(c >= 0, kUsage, "mix weights must not be negative, got " << c);
    period += c;
  }
  CHUTE_CHECK(period > 0, kUsage, "mix weights are all 0");
  // Every period ends with each source at its count exactly, so the next one
  // starts as the first did: one period (or the part of it needed) suffices.
  const std::vector<int32_t> cycle = one_period(counts, period, std::min(period, end));
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(end - begin));
  for (int64_t p = begin; p < end; ++p) out.push_back(cycle[static_cast<size_t>(p % period)]);
  return out;
}

}  // namespace chute

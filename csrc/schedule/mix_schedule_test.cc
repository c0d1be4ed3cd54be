#include "schedule/mix_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/random.h"

namespace chute {
namespace {

// The largest |taken_i(t) - t * n_i / n| over every prefix t of one period.
double worst_deviation(const std::vector<int64_t>& counts) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  const std::vector<int32_t> s = mix_schedule(counts, 0, n);
  std::vector<int64_t> taken(counts.size(), 0);
  double worst = 0;
  for (int64_t t = 1; t <= n; ++t) {
    taken[static_cast<size_t>(s[static_cast<size_t>(t - 1)])] += 1;
    for (size_t i = 0; i < counts.size(); ++i) {
      const double ideal = static_cast<double>(t) * static_cast<double>(counts[i]) / n;
      worst = std::max(worst, std::abs(static_cast<double>(taken[i]) - ideal));
    }
  }
  for (size_t i = 0; i < counts.size(); ++i) EXPECT_EQ(taken[i], counts[i]);
  return worst;
}

TEST(MixSchedule, EachPeriodTakesEveryCountExactlyAndPrefixesStayWithinOne) {
  EXPECT_LE(worst_deviation({7, 3}), 0.5);
  EXPECT_LE(worst_deviation({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 100}), 1.0 - 1.0 / 20);
  EXPECT_LE(worst_deviation({1, 1, 1, 1, 1, 1, 1, 1, 1, 50, 50}), 1.0 - 1.0 / 20);
  Rng rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t k = 2 + rng.below(9);
    std::vector<int64_t> counts(k);
    for (int64_t& c : counts) {
      c = static_cast<int64_t>(rng.below(4) == 0 ? rng.below(200) : rng.below(12));
    }
    counts[0] += 1;
    const double bound = 1.0 - 1.0 / (2.0 * static_cast<double>(k) - 2.0);
    EXPECT_LE(worst_deviation(counts), bound + 1e-12) << "trial " << trial;
  }
}

TEST(MixSchedule, RepeatsWithItsPeriodAndAnySliceMatchesTheWhole) {
  const std::vector<int64_t> counts = {2, 0, 3};
  const std::vector<int32_t> whole = mix_schedule(counts, 0, 20);
  for (size_t p = 0; p < whole.size(); ++p) {
    EXPECT_NE(whole[p], 1);
    EXPECT_EQ(whole[p], whole[p % 5]);
  }
  const std::vector<int32_t> slice = mix_schedule(counts, 7, 13);
  EXPECT_EQ(slice, std::vector<int32_t>(whole.begin() + 7, whole.begin() + 13));
  EXPECT_EQ(mix_schedule({0, 4}, 0, 3), (std::vector<int32_t>{1, 1, 1}));
}

TEST(MixSchedule, RefusesWeightsThatMixNothing) {
  EXPECT_THROW(mix_schedule({0, 0}, 0, 1), Error);
  EXPECT_THROW(mix_schedule({2, -1}, 0, 1), Error);
  EXPECT_THROW(mix_schedule({2, 1}, 3, 1), Error);
}

}  // namespace
}  // namespace chute

// Which source each position of a weighted mix takes. Source i is weighted by
// an integer count n_i; over every period of n = sum(n_i) positions it takes
// exactly n_i of them, and within a period every prefix of t positions holds
// within one of t * n_i / n from each source: the chairman assignment of
// Tijdeman (1980), whose bound is 1 - 1/(2k - 2) for k sources with a
// positive count (exact rational arithmetic, so the bound holds exactly).
#pragma once

#include <cstdint>
#include <vector>

namespace chute {

// The sources of positions [begin, end) of the mix weighted by `counts`
// (at least one positive, none negative).
std::vector<int32_t> mix_schedule(const std::vector<int64_t>& counts, int64_t begin, int64_t end);

}  // namespace chute

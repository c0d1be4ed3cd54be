#include "sources/selected_samples.h"

#include <sstream>
#include <utility>

#include "core/error.h"

namespace chute {

SelectedSamples::SelectedSamples(std::unique_ptr<SampleSource> inner, std::vector<int64_t> ranges,
                                 std::string url)
    : inner_(std::move(inner)), ranges_(std::move(ranges)), url_(std::move(url)) {
  const std::string why = invalid(ranges_);
  CHUTE_CHECK(why.empty(), kUsage, "sample ranges of " << url_ << ": " << why);
}

std::string SelectedSamples::invalid(const std::vector<int64_t>& ranges) {
  if (ranges.size() % 2 != 0) return "need begin/end pairs";
  int64_t previous_end = 0;
  for (size_t i = 0; i < ranges.size(); i += 2) {
    std::ostringstream why;
    if (ranges[i] < previous_end || ranges[i] >= ranges[i + 1]) {
      why << "range [" << ranges[i] << ", " << ranges[i + 1]
          << ") is empty, overlaps or precedes the one before";
      return why.str();
    }
    previous_end = ranges[i + 1];
  }
  return std::string();
}

bool SelectedSamples::next(EncodedSample& out) {
  while (2 * range_ < ranges_.size()) {
    const int64_t begin = ranges_[2 * range_];
    const int64_t end = ranges_[2 * range_ + 1];
    if (position_ >= end) {
      ++range_;
      continue;
    }
    // A shard shorter than its index said was changed after the position
    // was taken: resuming would read other samples than the ones left.
    bool read = false;
    try {
      read = inner_->next(out);
    } catch (const Error&) {
      // A bad sample still takes its position; one outside the ranges is
      // another rank's to report.
      const Failure f = inner_->failure();
      const int64_t at = f.samples_lost > 0 ? position_ : position_ - 1;
      position_ += static_cast<int64_t>(f.samples_lost);
      if (f.resumable && at < begin) continue;
      throw;
    }
    CHUTE_CHECK(read, kData,
                url_ << " ended after " << position_ << " samples, but samples [" << begin << ", "
                     << end << ") of it were to be read (the shard changed since its index "
                     << "or the resumed state was made)");
    if (position_++ >= begin) return true;
  }
  return false;
}

}  // namespace chute

// Part of a source: the samples whose position in it (0 for its first
// sample) lies in given ranges. An elastic resume reads the rest of a shard
// that other ranks had begun, or single samples a shuffle buffer still held,
// this way. Samples before a range are read and dropped (a tar stream has no
// sample table to seek by); reading stops after the last range.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sources/sample_source.h"

namespace chute {

class SelectedSamples final : public SampleSource {
 public:
  // `ranges`: begin0, end0, begin1, end1, ... sorted, disjoint, each
  // begin < end. `url` names the source when it ends before a range does.
  SelectedSamples(std::unique_ptr<SampleSource> inner, std::vector<int64_t> ranges,
                  std::string url);

  bool next(EncodedSample& out) override;
  Failure failure() const override { return inner_->failure(); }
  bool in_place() const override { return inner_->in_place(); }

  // Why `ranges` cannot select samples, or empty when it can.
  static std::string invalid(const std::vector<int64_t>& ranges);

 private:
  std::unique_ptr<SampleSource> inner_;
  const std::vector<int64_t> ranges_;
  const std::string url_;
  size_t range_ = 0;     // the range being read
  int64_t position_ = 0;  // of the next sample `inner_` yields
};

}  // namespace chute

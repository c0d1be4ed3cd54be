// The samples a shard's source errors cost under the skip policy, each
// counted once. A parse thread drops a sample for what it lacks (a missing
// field, a bad header) and counts it then; when the source then ends with
// an error that counts the sample it may have cut short, that is the sample
// already counted (SampleSource::Failure::samples_lost).
#pragma once

#include <cstdint>

#include "sources/sample_source.h"

namespace chute {

class SourceLosses {
 public:
  // The sample read last goes on towards a batch.
  void kept() { last_dropped_ = false; }
  // The sample read last was dropped and counted.
  void dropped() { last_dropped_ = true; }

  // The samples that the error next() threw, costing `cost`, lost and that
  // were not counted yet.
  uint64_t uncounted(SampleSource::Failure cost) {
    // An end counts one sample, the one it may have cut short: the sample
    // read last, if it was dropped here and so counted already. An error
    // that lost a sample of its own is about another.
    if (!cost.resumable && last_dropped_ && cost.samples_lost > 0) cost.samples_lost -= 1;
    if (!cost.resumable || cost.samples_lost > 0) last_dropped_ = false;
    return cost.samples_lost;
  }

 private:
  bool last_dropped_ = false;
};

}  // namespace chute

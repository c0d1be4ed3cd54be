#include "sources/source_losses.h"

#include <gtest/gtest.h>

namespace chute {
namespace {

constexpr SampleSource::Failure kBadSample{true, 1};   // the source goes on
constexpr SampleSource::Failure kLateFault{true, 0};   // about the sample before
constexpr SampleSource::Failure kEnd{false, 1};        // may have cut a sample short

TEST(SourceLosses, ABadSampleIsAlwaysItsOwnLoss) {
  SourceLosses losses;
  EXPECT_EQ(losses.uncounted(kBadSample), 1u);
  losses.dropped();
  EXPECT_EQ(losses.uncounted(kBadSample), 1u);
}

TEST(SourceLosses, AnEndAfterAKeptSampleCountsTheSampleItCut) {
  SourceLosses losses;
  losses.kept();
  EXPECT_EQ(losses.uncounted(kEnd), 1u);
}

TEST(SourceLosses, AnEndAfterADroppedSampleCountsNothingMore) {
  // The sample the end cut short is the one dropped for what it lacked.
  SourceLosses losses;
  losses.dropped();
  EXPECT_EQ(losses.uncounted(kEnd), 0u);
  // Counted once: the drop is settled.
  EXPECT_EQ(losses.uncounted(kEnd), 1u);
}

TEST(SourceLosses, AFaultAboutTheDroppedSampleLeavesItTheLastRead) {
  SourceLosses losses;
  losses.dropped();
  EXPECT_EQ(losses.uncounted(kLateFault), 0u);
  EXPECT_EQ(losses.uncounted(kEnd), 0u);
}

TEST(SourceLosses, ALostSampleOfItsOwnSettlesTheDrop) {
  // An error that lost another sample after the dropped one: an end now
  // cuts that other one, not counted yet.
  SourceLosses losses;
  losses.dropped();
  EXPECT_EQ(losses.uncounted(kBadSample), 1u);
  EXPECT_EQ(losses.uncounted(kEnd), 1u);
}

TEST(SourceLosses, AKeptSampleAfterADropIsTheLastRead) {
  SourceLosses losses;
  losses.dropped();
  losses.kept();
  EXPECT_EQ(losses.uncounted(kEnd), 1u);
}

TEST(SourceLosses, AnEndThatCostNothingCountsNothing) {
  SourceLosses losses;
  EXPECT_EQ(losses.uncounted(SampleSource::Failure{false, 0}), 0u);
  losses.dropped();
  EXPECT_EQ(losses.uncounted(SampleSource::Failure{false, 0}), 0u);
}

}  // namespace
}  // namespace chute

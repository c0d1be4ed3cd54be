#include "sources/selected_samples.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace chute {
namespace {

// Samples keyed "s0", "s1", ... up to `count`; the one at `bad` is lost
// with an error the source goes on after.
class CountingSource final : public SampleSource {
 public:
  explicit CountingSource(int count, int bad = -1) : count_(count), bad_(bad) {}
  bool next(EncodedSample& out) override {
    if (next_ == count_) return false;
    const int position = next_++;
    CHUTE_CHECK(position != bad_, kData, "bad sample s" << position);
    out.key = "s" + std::to_string(position);
    return true;
  }
  Failure failure() const override { return Failure{true, 1}; }
  bool in_place() const override { return false; }

 private:
  int count_;
  int bad_;
  int next_ = 0;
};

std::vector<std::string> keys(std::vector<int64_t> ranges, int count) {
  SelectedSamples source(std::make_unique<CountingSource>(count), std::move(ranges), "t.tar");
  std::vector<std::string> out;
  EncodedSample s;
  while (source.next(s)) out.push_back(s.key);
  return out;
}

TEST(SelectedSamples, YieldsTheSamplesOfEachRangeInOrder) {
  EXPECT_EQ(keys({2, 4}, 10), (std::vector<std::string>{"s2", "s3"}));
  EXPECT_EQ(keys({0, 1, 3, 4, 7, 10}, 10),
            (std::vector<std::string>{"s0", "s3", "s7", "s8", "s9"}));
  EXPECT_EQ(keys({0, 10}, 10).size(), 10u);
}

TEST(SelectedSamples, StopsReadingAfterTheLastRange) {
  // A source that would fail past sample 3 is never asked for it.
  class Failing final : public SampleSource {
   public:
    bool next(EncodedSample& out) override {
      CHUTE_CHECK(read_ < 3, kData, "read past the range");
      out.key = "s" + std::to_string(read_++);
      return true;
    }
    Failure failure() const override { return Failure{}; }
    bool in_place() const override { return false; }
    int read_ = 0;
  };
  SelectedSamples source(std::make_unique<Failing>(), {1, 3}, "t.tar");
  EncodedSample s;
  ASSERT_TRUE(source.next(s));
  ASSERT_TRUE(source.next(s));
  EXPECT_EQ(s.key, "s2");
  EXPECT_FALSE(source.next(s));
}

TEST(SelectedSamples, ASourceShorterThanItsRangesIsADataError) {
  try {
    keys({3, 6}, 5);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kData);
    EXPECT_NE(e.message().find("t.tar ended after 5 samples"), std::string::npos) << e.message();
  }
}

TEST(SelectedSamples, ABadSampleKeepsItsPositionAndOnlyASelectedOneIsReported) {
  // Outside the ranges: another rank's to report; the positions stay right.
  SelectedSamples skipping(std::make_unique<CountingSource>(10, 1), {3, 5}, "t.tar");
  EncodedSample s;
  ASSERT_TRUE(skipping.next(s));
  EXPECT_EQ(s.key, "s3");
  // Inside: thrown, and the next sample is the one after it.
  SelectedSamples reporting(std::make_unique<CountingSource>(10, 3), {3, 5}, "t.tar");
  EXPECT_THROW(reporting.next(s), Error);
  EXPECT_TRUE(reporting.failure().resumable);
  ASSERT_TRUE(reporting.next(s));
  EXPECT_EQ(s.key, "s4");
  EXPECT_FALSE(reporting.next(s));
}

TEST(SelectedSamples, RefusesRangesThatAreNotSortedDisjointPairs) {
  EXPECT_FALSE(SelectedSamples::invalid({1}).empty());
  EXPECT_FALSE(SelectedSamples::invalid({3, 3}).empty());
  EXPECT_FALSE(SelectedSamples::invalid({0, 4, 2, 6}).empty());
  EXPECT_TRUE(SelectedSamples::invalid({0, 4, 4, 6}).empty());
  EXPECT_THROW(SelectedSamples(std::make_unique<CountingSource>(3), {2, 1}, "t.tar"), Error);
}

}  // namespace
}  // namespace chute

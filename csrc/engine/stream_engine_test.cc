#include "engine/stream_engine.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "sources/sample_testing.h"

namespace chute {
namespace {

// A shard named by its sample count ("7" holds 7 samples); sample i of the
// shard at plan index k has the key "k:i". Samples are copies, not views.
class CountedShard final : public SampleSource {
 public:
  CountedShard(uint32_t index, int64_t samples) : index_(index), samples_(samples) {}
  bool next(EncodedSample& out) override {
    if (read_ == samples_) return false;
    out = test::encoded_sample(std::to_string(index_) + ":" + std::to_string(read_),
                               {{"id", std::to_string(read_)}}, index_);
    ++read_;
    return true;
  }
  Failure failure() const override { return {}; }
  bool in_place() const override { return false; }

 private:
  const uint32_t index_;
  const int64_t samples_;
  int64_t read_ = 0;
};

class CountedShards final : public SampleSourceFactory {
 public:
  std::unique_ptr<SampleSource> open(const std::string& url, uint32_t index,
                                     const SourceOpenOptions&) const override {
    return std::make_unique<CountedShard>(index, std::stoll(url));
  }
  SampleLocation location(const std::string& url, const EncodedSample& sample,
                          const SampleMember*) const override {
    return {url + " sample '" + sample.key + "'", {url, "", sample.key}};
  }
};

StreamPlan plan_of(std::vector<std::string> shards, int64_t batch_size) {
  StreamPlan plan;
  plan.urls = std::move(shards);
  plan.sources = std::make_shared<CountedShards>();
  plan.batch_size = batch_size;
  plan.seed = 3;
  return plan;
}

struct Epoch {
  std::vector<std::vector<std::string>> batches;  // keys
  uint64_t repeated = 0;                          // EngineStats::samples_repeated
  int64_t formed = 0;
};

Epoch run(const StreamPlan& plan) {
  StreamEngine engine(plan);
  Epoch out;
  Batch b;
  while (engine.next(&b, 0) == OrderedResults::Status::kBatch) out.batches.push_back(b.keys);
  out.repeated = engine.stats().samples_repeated;
  out.formed = engine.batches_formed();
  return out;
}

std::vector<size_t> sizes(const Epoch& e) {
  std::vector<size_t> out;
  for (const auto& b : e.batches) out.push_back(b.size());
  return out;
}

std::vector<std::string> keys_of(const Epoch& e, size_t first, size_t last) {
  std::vector<std::string> out;
  for (size_t i = first; i < last; ++i) {
    out.insert(out.end(), e.batches[i].begin(), e.batches[i].end());
  }
  return out;
}

std::map<std::string, int> counted(const std::vector<std::string>& keys) {
  std::map<std::string, int> out;
  for (const std::string& k : keys) out[k] += 1;
  return out;
}

// Every sample of the shards once.
std::map<std::string, int> once(const std::vector<int>& shard_sizes) {
  std::map<std::string, int> out;
  for (size_t s = 0; s < shard_sizes.size(); ++s) {
    for (int i = 0; i < shard_sizes[s]; ++i) out[std::to_string(s) + ":" + std::to_string(i)] = 1;
  }
  return out;
}

TEST(StreamEngineLimits, MaxBatchesAloneStopsThereAndNeverReadsAgain) {
  StreamPlan plan = plan_of({"10", "7"}, 4);
  plan.max_batches = 3;
  EXPECT_EQ(sizes(run(plan)), (std::vector<size_t>{4, 4, 4}));
  plan.max_batches = 9;  // more than the data has: the epoch ends short
  const Epoch e = run(plan);
  EXPECT_EQ(sizes(e), (std::vector<size_t>{4, 4, 4, 4, 1}));
  EXPECT_EQ(counted(keys_of(e, 0, 5)), once({10, 7}));
  EXPECT_EQ(e.repeated, 0u);
}

// The shuffle buffer holds more than a pass: without the drain between
// passes, samples of the second would reach the first's batches.
TEST(StreamEngineLimits, RepeatToLimitBatchesEveryPassWholeBeforeTheNext) {
  for (int streams : {1, 2}) {
    for (size_t capacity : {size_t{0}, size_t{5}, size_t{100}}) {
      StreamPlan plan = plan_of({"10", "7"}, 4);
      plan.num_streams = streams;
      plan.shuffle_shards = true;
      plan.shuffle_capacity = capacity;
      plan.shuffle_initial = capacity;
      plan.max_batches = 9;
      plan.repeat_to_limit = true;
      const Epoch e = run(plan);
      SCOPED_TRACE(testing::Message() << streams << " streams, buffer " << capacity);
      // Each pass as an engine reading it alone forms it: 17 samples in
      // five batches, the last short (one stream), or the last of each
      // stream's (two streams, one shard each).
      ASSERT_EQ(e.batches.size(), 9u);
      EXPECT_EQ(counted(keys_of(e, 0, 5)), once({10, 7}));
      const std::vector<std::string> again = keys_of(e, 5, 9);
      EXPECT_EQ(e.repeated, again.size());
      EXPECT_EQ(counted(again).size(), again.size());  // the second pass, each at most once
    }
  }
}

TEST(StreamEngineLimits, PassesAreTheSameWhateverTheThreadCount) {
  StreamPlan plan = plan_of({"10", "7", "5"}, 4);
  plan.num_streams = 2;
  plan.shuffle_shards = true;
  plan.shuffle_capacity = 9;
  plan.shuffle_initial = 3;
  plan.max_batches = 20;
  plan.repeat_to_limit = true;
  plan.num_threads = 1;
  plan.parse_ahead = 1;
  const Epoch one = run(plan);
  plan.num_threads = 3;
  plan.parse_ahead = 3;
  const Epoch three = run(plan);
  EXPECT_EQ(one.batches.size(), 20u);
  EXPECT_EQ(one.batches, three.batches);
  EXPECT_EQ(one.repeated, three.repeated);
}

TEST(StreamEngineLimits, WithoutPartialEachPassDropsItsOwnRemainder) {
  StreamPlan plan = plan_of({"10", "7"}, 4);
  plan.partial = false;
  plan.max_batches = 6;
  plan.repeat_to_limit = true;
  const Epoch e = run(plan);
  EXPECT_EQ(sizes(e), (std::vector<size_t>{4, 4, 4, 4, 4, 4}));
  // 16 of the first pass's 17 samples, then the second pass's first 8.
  EXPECT_EQ(counted(keys_of(e, 0, 4)).size(), 16u);
  EXPECT_EQ(e.repeated, 8u);
}

TEST(StreamEngineLimits, MaxSamplesCutsTheBatchThatReachesIt) {
  StreamPlan plan = plan_of({"10", "7"}, 4);
  plan.max_samples = 11;
  EXPECT_EQ(sizes(run(plan)), (std::vector<size_t>{4, 4, 3}));
  plan.max_samples = 30;
  plan.repeat_to_limit = true;
  const Epoch e = run(plan);
  EXPECT_EQ(sizes(e), (std::vector<size_t>{4, 4, 4, 4, 1, 4, 4, 4, 1}));
  EXPECT_EQ(counted(keys_of(e, 0, 5)), once({10, 7}));
  EXPECT_EQ(e.repeated, 13u);
}

TEST(StreamEngineLimits, APassThatFormsNoBatchEndsTheEpochShort) {
  StreamPlan plan = plan_of({"3"}, 4);
  plan.partial = false;
  plan.max_batches = 5;
  plan.repeat_to_limit = true;
  EXPECT_TRUE(run(plan).batches.empty());
}

TEST(StreamEngineLimits, ASkippedStartFormsTheSameBatchesAcrossPasses) {
  StreamPlan plan = plan_of({"10", "7"}, 4);
  plan.shuffle_shards = true;
  plan.shuffle_capacity = 6;
  plan.max_batches = 12;
  plan.repeat_to_limit = true;
  const Epoch whole = run(plan);
  plan.skip_batches = 7;  // a resume in the second pass
  const Epoch rest = run(plan);
  EXPECT_EQ(rest.formed, 12);
  ASSERT_EQ(rest.batches.size(), 5u);
  EXPECT_EQ(rest.batches, std::vector<std::vector<std::string>>(whole.batches.begin() + 7,
                                                                whole.batches.end()));
  // Passes of five batches (4, 4, 4, 4, 1): batches 7..9 of the second
  // and 10..11 of the third.
  EXPECT_EQ(rest.repeated, 4u + 4 + 1 + 4 + 4);
}

TEST(StreamEngineLimits, ClosingWhileStreamsWaitForAPassEndsPromptly) {
  StreamPlan plan = plan_of({"10", "7", "5"}, 4);
  plan.num_streams = 3;
  plan.max_batches = 1000;
  plan.repeat_to_limit = true;
  plan.prefetch_batches = 1;
  StreamEngine engine(plan);
  Batch b;
  ASSERT_EQ(engine.next(&b, 0), OrderedResults::Status::kBatch);
  engine.close();
  EXPECT_EQ(engine.next(&b, 0), OrderedResults::Status::kClosed);
}

TEST(StreamEngineLimits, RepeatToLimitWithoutALimitIsRefused) {
  StreamPlan plan = plan_of({"10"}, 4);
  plan.repeat_to_limit = true;
  const std::optional<Error> e = test::error_from([&] { check_stream_plan(plan); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_NE(std::string(e->what()).find("repeat_to_limit needs max_batches or max_samples"),
            std::string::npos);
}

}  // namespace
}  // namespace chute

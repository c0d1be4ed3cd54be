#include "engine/stream_plan.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
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

// Each url holds `samples` samples keyed "<url>/<position>"; the factory
// remembers how it was last asked to open one.
class CountingSources final : public SampleSourceFactory {
 public:
  explicit CountingSources(int samples) : samples_(samples) {}

  std::unique_ptr<SampleSource> open(const std::string& url, uint32_t index,
                                     const SourceOpenOptions& options) const override {
    last_options = options;
    return std::make_unique<Counting>(url, index, samples_);
  }
  SampleLocation location(const std::string& url, const EncodedSample& sample,
                          const SampleMember* member) const override {
    return {url + "#" + sample.key + (member != nullptr ? "/" + member->name : ""),
            {url, member != nullptr ? member->name : "", sample.key}};
  }

  mutable SourceOpenOptions last_options;

 private:
  class Counting final : public SampleSource {
   public:
    Counting(std::string url, uint32_t index, int samples)
        : url_(std::move(url)), index_(index), samples_(samples) {}
    bool next(EncodedSample& out) override {
      if (next_ == samples_) return false;
      out.key = url_ + "/" + std::to_string(next_++);
      out.source_index = index_;
      return true;
    }
    Failure failure() const override { return Failure{}; }
    bool in_place() const override { return false; }

   private:
    const std::string url_;
    const uint32_t index_;
    const int samples_;
    int next_ = 0;
  };

  const int samples_;
};

StreamPlan valid_plan() {
  StreamPlan plan;
  plan.urls = {"a.tar", "b.tar"};
  plan.sources = std::make_shared<CountingSources>(5);
  FieldPlan f;
  f.name = "image";
  f.extensions = {"jpg", "png"};
  plan.fields.push_back(f);
  return plan;
}

std::optional<Error> check(const std::function<void(StreamPlan&)>& change) {
  StreamPlan plan = valid_plan();
  change(plan);
  return test::error_from([&] { check_stream_plan(plan); });
}

void expect_usage_error(const std::function<void(StreamPlan&)>& change,
                        const std::string& message) {
  const std::optional<Error> e = check(change);
  ASSERT_TRUE(e) << message;
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(), message);
}

TEST(StreamPlan, AValidPlanPasses) {
  EXPECT_FALSE(check([](StreamPlan&) {}));
  EXPECT_FALSE(check([](StreamPlan& p) {
    p.deliver_stride = 3;
    p.deliver_offset = 2;
    p.sample_ranges = {{0, 2, 4, 5}};
  }));
}

TEST(StreamPlan, ChecksNameWhatKeepsAPlanFromRunning) {
  expect_usage_error([](StreamPlan& p) { p.urls.clear(); }, "no shards to read");
  expect_usage_error([](StreamPlan& p) { p.sources = nullptr; },
                     "the plan has no source factory");
  expect_usage_error([](StreamPlan& p) { p.batch_size = 0; }, "batch_size must be >= 1, got 0");
  expect_usage_error([](StreamPlan& p) { p.num_streams = 0; }, "streams must be >= 1");
  expect_usage_error([](StreamPlan& p) { p.num_threads = 0; }, "threads must be >= 1");
  expect_usage_error(
      [](StreamPlan& p) {
        p.deliver_stride = 2;
        p.deliver_offset = 2;
      },
      "deliver_offset must be in [0, deliver_stride), got 2 of 2");
  expect_usage_error([](StreamPlan& p) { p.deliver_offset = -1; },
                     "deliver_offset must be in [0, deliver_stride), got -1 of 1");
  expect_usage_error([](StreamPlan& p) { p.sample_ranges = {{}, {}, {}}; },
                     "sample ranges for 3 urls, but the plan has 2");
  expect_usage_error([](StreamPlan& p) { p.sample_ranges = {{}, {3}}; },
                     "sample ranges: need begin/end pairs");
  expect_usage_error([](StreamPlan& p) { p.fields[0].extensions.clear(); },
                     "field 'image' names no extension");
}

TEST(StreamPlan, SampleDecodingTakesThePlansFieldsAndLocatesByUrl) {
  StreamPlan plan = valid_plan();
  plan.keep_other_members = true;
  plan.collect_keys = false;
  plan.seed = 77;
  plan.on_error = ErrorPolicy::kSkip;
  const SampleDecoding d = sample_decoding_of(plan);
  ASSERT_EQ(d.fields.size(), 1u);
  EXPECT_EQ(d.fields[0].name, "image");
  EXPECT_TRUE(d.keep_other_members);
  EXPECT_FALSE(d.collect_keys);
  EXPECT_EQ(d.seed, 77u);
  EXPECT_EQ(d.on_error, ErrorPolicy::kSkip);
  const EncodedSample sample = test::encoded_sample("k", {{"jpg", "x"}}, 1);
  EXPECT_EQ(d.locate(sample, nullptr).text, "b.tar#k");
  EXPECT_EQ(d.locate(sample, &sample.members[0]).text, "b.tar#k/k.jpg");
  EXPECT_EQ(d.locate(sample, &sample.members[0]).place.url, "b.tar");
}

TEST(StreamPlan, ShardScheduleTakesThePlansOrderSettings) {
  StreamPlan plan = valid_plan();
  plan.shuffle_shards = true;
  plan.repeat = true;
  plan.seed = 5;
  plan.epoch = 3;
  const ShardScheduleSpec spec = shard_schedule_of(plan, 1, 2);
  EXPECT_EQ(spec.num_shards, 2u);
  EXPECT_EQ(spec.stream, 1u);
  EXPECT_EQ(spec.num_streams, 2u);
  EXPECT_TRUE(spec.shuffle);
  EXPECT_TRUE(spec.repeat);
  EXPECT_FALSE(spec.resampled);
  EXPECT_EQ(spec.seed, 5u);
  EXPECT_EQ(spec.epoch, 3);
}

std::vector<std::string> read_all(SampleSource& source) {
  std::vector<std::string> keys;
  EncodedSample s;
  while (source.next(s)) keys.push_back(s.key);
  return keys;
}

TEST(StreamPlan, AShardOpensInPlaceOnlyWithoutASampleShuffle) {
  StreamPlan plan = valid_plan();
  auto sources = std::make_shared<CountingSources>(2);
  plan.sources = sources;
  const std::atomic<bool> cancel{false};
  open_planned_shard(plan, 0, &cancel);
  EXPECT_TRUE(sources->last_options.in_place);
  EXPECT_EQ(sources->last_options.cancel, &cancel);
  plan.shuffle_capacity = 10;
  open_planned_shard(plan, 0, &cancel);
  EXPECT_FALSE(sources->last_options.in_place);
}

TEST(StreamPlan, AShardIsReadWholeOrAsItsRangesSelect) {
  StreamPlan plan = valid_plan();
  plan.sample_ranges = {{}, {1, 3}};
  std::unique_ptr<SampleSource> a = open_planned_shard(plan, 0, nullptr);
  EXPECT_EQ(read_all(*a),
            (std::vector<std::string>{"a.tar/0", "a.tar/1", "a.tar/2", "a.tar/3", "a.tar/4"}));
  std::unique_ptr<SampleSource> b = open_planned_shard(plan, 1, nullptr);
  EXPECT_EQ(read_all(*b), (std::vector<std::string>{"b.tar/1", "b.tar/2"}));
  plan.sample_ranges.resize(1);  // no entry for b: read whole
  b = open_planned_shard(plan, 1, nullptr);
  EXPECT_EQ(read_all(*b).size(), 5u);
}

}  // namespace
}  // namespace chute

#include "engine/stream_plan.h"

#include <utility>

#include "core/error.h"
#include "sources/selected_samples.h"

namespace chute {

void check_stream_plan(const StreamPlan& plan) {
  CHUTE_CHECK(!plan.urls.empty(), kUsage, "no shards to read");
  CHUTE_CHECK(plan.sources != nullptr, kUsage, "the plan has no source factory");
  CHUTE_CHECK(plan.batch_size >= 1, kUsage, "batch_size must be >= 1, got " << plan.batch_size);
  CHUTE_CHECK(plan.num_streams >= 1, kUsage, "streams must be >= 1");
  CHUTE_CHECK(plan.num_threads >= 1, kUsage, "threads must be >= 1");
  CHUTE_CHECK(plan.deliver_stride >= 1 && plan.deliver_offset >= 0 &&
                  plan.deliver_offset < plan.deliver_stride,
              kUsage,
              "deliver_offset must be in [0, deliver_stride), got "
                  << plan.deliver_offset << " of " << plan.deliver_stride);
  CHUTE_CHECK(plan.sample_ranges.size() <= plan.urls.size(), kUsage,
              "sample ranges for " << plan.sample_ranges.size() << " urls, but the plan has "
                                   << plan.urls.size());
  for (const std::vector<int64_t>& ranges : plan.sample_ranges) {
    const std::string why = SelectedSamples::invalid(ranges);
    CHUTE_CHECK(why.empty(), kUsage, "sample ranges: " << why);
  }
  CHUTE_CHECK(!plan.repeat_to_limit || plan.max_batches >= 0 || plan.max_samples >= 0, kUsage,
              "repeat_to_limit needs max_batches or max_samples: the passes would never end");
  for (const FieldPlan& f : plan.fields) {
    CHUTE_CHECK(!f.extensions.empty(), kUsage, "field '" << f.name << "' names no extension");
  }
}

SampleDecoding sample_decoding_of(const StreamPlan& plan) {
  SampleDecoding d;
  d.fields = plan.fields;
  d.keep_other_members = plan.keep_other_members;
  d.collect_keys = plan.collect_keys;
  d.seed = plan.seed;
  d.on_error = plan.on_error;
  d.locate = [&plan](const EncodedSample& sample, const SampleMember* member) {
    return plan.sources->location(plan.urls[sample.source_index], sample, member);
  };
  return d;
}

ShardScheduleSpec shard_schedule_of(const StreamPlan& plan, size_t stream, size_t num_streams) {
  ShardScheduleSpec spec;
  spec.num_shards = plan.urls.size();
  spec.stream = stream;
  spec.num_streams = num_streams;
  spec.shuffle = plan.shuffle_shards;
  spec.repeat = plan.repeat;
  spec.resampled = plan.resampled;
  spec.seed = plan.seed;
  spec.epoch = plan.epoch;
  return spec;
}

std::unique_ptr<SampleSource> open_planned_shard(const StreamPlan& plan, uint32_t shard,
                                                 const std::atomic<bool>* cancel) {
  SourceOpenOptions options;
  options.in_place = plan.shuffle_capacity == 0;
  options.cancel = cancel;
  std::unique_ptr<SampleSource> source = plan.sources->open(plan.urls[shard], shard, options);
  if (shard < plan.sample_ranges.size() && !plan.sample_ranges[shard].empty()) {
    source = std::make_unique<SelectedSamples>(std::move(source), plan.sample_ranges[shard],
                                               plan.urls[shard]);
  }
  return source;
}

}  // namespace chute

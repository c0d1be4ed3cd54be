// The plan the stream engine runs: which urls, how to split, shuffle and
// batch their samples, and for every output field which member supplies it
// and which decoder decodes it. Formats and codecs come in as objects behind
// the pipeline's interfaces (a source factory, field decoders); compose/
// builds them from what Python asked for. Nothing in here changes while an
// epoch runs.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "batching/sample_decoding.h"
#include "memory/batch_allocator.h"
#include "schedule/shard_schedule.h"
#include "sources/sample_source.h"

namespace chute {

struct StreamPlan {
  std::vector<std::string> urls;
  // Per url, the samples to read (sources/selected_samples.h: begin/end
  // pairs of sample positions); a url without an entry, or with an empty
  // one, is read whole. An elastic resume reads parts of shards this way.
  std::vector<std::vector<int64_t>> sample_ranges;
  std::shared_ptr<const SampleSourceFactory> sources;  // opens the urls
  std::vector<FieldPlan> fields;
  // Members whose extension no field claims are returned raw per sample
  // (dict-style samples keep every member).
  bool keep_other_members = false;
  bool collect_keys = true;  // Batch::keys filled (only when the output shows __key__)

  int num_streams = 1;        // logical streams: they, not threads, define order
  int num_threads = 1;        // decode threads
  int parse_ahead = 2;        // shards parsed concurrently per stream (order unaffected)
  int prefetch_batches = 4;   // batches in flight (assigned, not yet consumed)
  // ... and their bytes (encoded samples plus decoded rows); a batch larger
  // than this still goes alone. 0: no byte bound.
  size_t max_inflight_bytes = size_t{1} << 30;
  // When > 0, a batch is also cut once its samples hold this many bytes: for
  // plans whose batches are not the user's (samples are handed out one by
  // one), so that large samples do not make large batches. Deterministic,
  // so a resumed epoch cuts the same batches.
  size_t max_batch_bytes = 0;
  // The consumer hands samples out one by one (batches are not the user's):
  // under raise, the samples that came before an error in a stream are
  // delivered before it, as they would have been one at a time.
  bool samples_one_by_one = false;

  bool resampled = false;     // draw shards with replacement, forever
  bool shuffle_shards = false;
  // Restart the shard list when it runs out, one endless pass: its samples
  // run on through the shuffle buffers and batches (WebDataset(repeat=True)).
  bool repeat = false;

  size_t shuffle_capacity = 0;  // samples; 0 = no sample shuffle
  size_t shuffle_initial = 0;
  size_t shuffle_max_bytes = size_t{1} << 30;

  uint64_t seed = 0;
  int64_t epoch = 0;

  int64_t batch_size = 1;
  bool partial = true;         // emit a short last batch
  int64_t max_batches = -1;    // stop after this many batches (-1: when the data ends)
  // Stop once the batches hold this many samples, the batch that reaches it
  // cut short (-1: no limit): a plan whose batches are not the user's
  // (samples_one_by_one) is limited in samples.
  int64_t max_samples = -1;
  // When the shard list runs out before max_batches or max_samples, read it
  // again, pass after pass, until the limit (WebDataset's even_batches: every
  // DDP rank yields the same count). A pass begins only once the one before
  // has been batched whole: every stream's shuffle buffer drained and its
  // last batch formed (partial, or dropped without `partial`), so no sample
  // comes twice before every sample came once. The batches of each pass are
  // those an engine reading it alone forms; a pass that forms no batch ends
  // the epoch short. EngineStats::samples_repeated counts the samples of the
  // passes after the first.
  bool repeat_to_limit = false;
  // Resume: the first skip_batches batches of the epoch are formed (so the
  // order is the same) but not decoded or delivered.
  int64_t skip_batches = 0;
  // Process workers: every worker's engine forms every batch (so the order
  // is the plan's), but decodes and delivers only the batches b with
  // b % deliver_stride == deliver_offset. Samples skipped while forming are
  // recorded by the engine with offset 0 only, so that the workers' skip
  // logs and counts add up to one engine's.
  int64_t deliver_stride = 1;
  int64_t deliver_offset = 0;

  ErrorPolicy on_error = ErrorPolicy::kRaise;
  PinHooks pin;  // page-lock batch memory (see memory/batch_allocator.h)
};

// Throws kUsage naming what keeps `plan` from running: no urls or no source
// factory, a count below 1, a deliver offset outside its stride, malformed
// sample ranges (SelectedSamples::invalid) or ranges for more urls than the
// plan has, a field that names no extension, repeat_to_limit without a
// limit.
void check_stream_plan(const StreamPlan& plan);

// The plan's part that decodes samples into batches. `locate` refers to
// `plan`, which must outlive the result.
SampleDecoding sample_decoding_of(const StreamPlan& plan);

// The shards that logical stream `stream` of `num_streams` reads.
ShardScheduleSpec shard_schedule_of(const StreamPlan& plan, size_t stream, size_t num_streams);

// Opens the plan's url `shard` as the engine reads it: in place unless its
// samples wait in a shuffle buffer, and only the samples its ranges select.
// `cancel` as in SourceOpenOptions.
std::unique_ptr<SampleSource> open_planned_shard(const StreamPlan& plan, uint32_t shard,
                                                 const std::atomic<bool>* cancel);

}  // namespace chute

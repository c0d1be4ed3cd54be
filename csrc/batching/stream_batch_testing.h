// Test-only: one batch of encoded samples decoded by StreamBatchJob on a
// piece scheduler, the way the stream engine runs it, for stream_batch_test.cc
// and the composition tests (compose/), which run real decoders through it.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "batching/ordered_results.h"
#include "batching/piece_scheduler.h"
#include "batching/stream_batch.h"
#include "core/error.h"
#include "core/testing.h"
#include "engine/stream_plan.h"
#include "sources/sample_testing.h"

namespace chute::test {

// One batch of samples through StreamBatchJob on a piece scheduler, as the
// stream engine runs it, with the parts of an engine it needs.
class BatchRun {
 public:
  BatchRun() {
    plan.urls = {"s0.tar", "s1.tar"};
    plan.sources = std::make_shared<LocatingSources>();
  }

  // Probes `samples` (a probe error propagates) and decodes them as
  // the batch at `absolute` in the epoch, on `workers` threads. The batch,
  // or the error it was delivered as.
  std::optional<Batch> run(std::vector<EncodedSample> samples, int64_t absolute = 0,
                           int workers = 1) {
    error.reset();
    const SampleDecoding decoding = sample_decoding_of(plan);
    const SampleFields fields(decoding);
    BatchTask task;
    task.sequence = 0;
    task.absolute = absolute;
    task.epoch = plan.epoch;
    for (EncodedSample& s : samples) {
      PlannedSample p;
      p.encoded = std::move(s);
      fields.probe(p);
      task.samples.push_back(std::move(p));
    }
    OrderedResults results(2);
    PieceScheduler scheduler(results);
    const StreamBatchContext context{&decoding, &fields, &allocator, &skips, &payload_buffers};
    EXPECT_TRUE(scheduler.push(std::make_shared<StreamBatchJob>(context, std::move(task))));
    scheduler.end();
    results.finish(1);
    std::vector<std::thread> threads;
    for (int i = 1; i < workers; ++i) threads.emplace_back([&] { scheduler.work(); });
    scheduler.work();
    for (std::thread& t : threads) t.join();
    Batch out;
    OrderedResults::Status status = OrderedResults::Status::kEnd;
    error = error_from([&] { status = results.next(&out, 30); });
    if (error) return std::nullopt;
    EXPECT_EQ(status, OrderedResults::Status::kBatch);
    if (status != OrderedResults::Status::kBatch) return std::nullopt;
    return out;
  }

  StreamPlan plan;
  BatchAllocator allocator;
  SkipLog skips;
  ByteBufferPool payload_buffers{size_t{1} << 24, size_t{1} << 24};
  std::optional<Error> error;  // the last run's, when its batch failed
};

}  // namespace chute::test

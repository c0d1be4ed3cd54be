// One batch of the stream engine on its way through the piece scheduler:
// its samples are decoded field by field, through the plan's field
// decoders, straight into their rows of the batch memory. Under the skip
// policy a row that fails is dropped (the batch comes out shorter); under
// raise the batch fails with its first failing row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "memory/batch_allocator.h"
#include "memory/byte_buffer_pool.h"
#include "pipeline/piece_scheduler.h"
#include "pipeline/sample_fields.h"
#include "pipeline/skip_log.h"
#include "pipeline/stream_plan.h"

namespace chute {

// What the engine's assembler formed: batch_size samples and where they go.
struct BatchTask {
  int64_t sequence = 0;  // delivery order
  int64_t absolute = 0;  // position in the epoch, counting skipped (resumed) batches
  std::vector<PlannedSample> samples;
};

// The engine's parts a batch uses; they outlive every batch.
struct StreamBatchContext {
  const StreamPlan* plan;
  const SampleFields* fields;
  BatchAllocator* allocator;
  SkipLog* skips;
  ByteBufferPool* payload_buffers;  // a finished batch returns its samples' buffers here
};

class StreamBatchJob final : public PieceJob {
 public:
  StreamBatchJob(const StreamBatchContext& context, BatchTask task);

 private:
  void allocate() override;
  void run(size_t begin, size_t end) override;
  void finish() override;

  void allocate_row(size_t row);
  void decode_row(size_t row);
  // Rows read in place are real only if their storage still held their
  // bytes after the reads.
  void check_in_place(size_t begin, size_t end);
  void drop_row(size_t row, const Error& error);

  const StreamBatchContext context_;
  BatchTask task_;
  std::vector<size_t> row_bytes_;  // per stacked column
  std::vector<uint8_t> failed_;    // rows dropped under the skip policy
};

}  // namespace chute

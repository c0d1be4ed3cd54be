// One batch of encoded samples on its way through the piece scheduler: its
// samples are decoded field by field, through the field decoders of a
// SampleDecoding, straight into their rows of the batch memory. Under the
// skip policy a row that fails is dropped (the batch comes out shorter);
// under raise the batch fails with its first failing row. The stream engine
// hands it samples its parse threads read; the indexed engine's sample mode
// has it read them first (prepare()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "batching/piece_scheduler.h"
#include "batching/sample_decoding.h"
#include "batching/sample_fields.h"
#include "batching/skip_log.h"
#include "memory/batch_allocator.h"
#include "memory/byte_buffer_pool.h"

namespace chute {

// The samples of one batch and where they go.
struct BatchTask {
  int64_t sequence = 0;  // delivery order
  int64_t absolute = 0;  // position in the epoch, counting skipped (resumed) batches
  int64_t epoch = 0;
  std::vector<PlannedSample> samples;
  // When set, row i's random draws (a random crop, a flip) derive from the
  // sample's own id ids[i] rather than from its place in the batch, so they
  // do not depend on how a sampler batches the samples.
  std::vector<int64_t> ids;
};

// The engine's parts a batch uses; they outlive every batch.
struct StreamBatchContext {
  const SampleDecoding* decoding;
  const SampleFields* fields;
  BatchAllocator* allocator;
  SkipLog* skips;
  ByteBufferPool* payload_buffers;  // a finished batch returns its samples' buffers here
};

// Rows per piece for `rows` samples holding `encoded_bytes` of payload in all.
size_t decode_piece_rows(size_t rows, uint64_t encoded_bytes);

class StreamBatchJob : public PieceJob {
 public:
  // Samples already read and probed, every stacked field of one shape.
  StreamBatchJob(const StreamBatchContext& context, BatchTask task);

 protected:
  // For a subclass that reads and probes its samples in prepare().
  StreamBatchJob(const StreamBatchContext& context, BatchTask task, size_t piece_rows);

  // Once, before the batch memory is allocated (on the first worker to take
  // a piece): where a subclass reads and probes its samples, drops the rows
  // that fail (drop_row) and batches as lists the stacked fields whose shapes
  // differ (unstack). A throw loses the batch.
  virtual void prepare() {}

  // Row `row` failed: the batch fails with it (raise) or comes out without it (skip).
  void drop_row(size_t row, const Error& error);
  // Field `field` is batched as one tensor per row in this batch.
  void unstack(size_t field) { unstacked_[field] = 1; }
  bool dropped(size_t row) const { return failed_[row] != 0; }

  const StreamBatchContext& context() const { return context_; }
  BatchTask& task() { return task_; }

 private:
  void allocate() override;
  void run(size_t begin, size_t end) override;
  void finish() override;

  void allocate_row(size_t row);
  void decode_row(size_t row);
  // Rows read in place are real only if their storage still held their
  // bytes after the reads.
  void check_in_place(size_t begin, size_t end);

  const StreamBatchContext context_;
  BatchTask task_;
  std::vector<size_t> row_bytes_;   // per stacked column
  std::vector<uint8_t> failed_;     // rows dropped under the skip policy
  std::vector<uint8_t> unstacked_;  // per field: a list column in this batch
};

}  // namespace chute

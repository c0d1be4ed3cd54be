// The stream engine: tar shards → samples → shuffle → batches, on native
// threads.
//
//   parse threads (up to parse_ahead per stream): each reads one shard,
//     groups members into samples, resolves and probes each field (headers
//     only);
//   stream threads (one per logical stream): take the parsed shards in
//     order, shuffle encoded samples, hand them on in chunks;
//   assembler thread: takes batch_size samples from the streams in
//     round-robin order, numbers the batch, checks that stacked fields agree
//     in shape, and queues it;
//   decode threads: decode every field of a batch straight into its row of
//     the batch buffers; a batch is cut into pieces of rows that any decode
//     thread may take, so all of them work on the oldest batch first (the
//     first batch arrives sooner, and the last one does not leave threads
//     idle);
//   consumer (Python, in next()): receives batches in number order.
//
// Order depends only on the plan (seed, epoch, streams), never on how many
// decode threads run or how fast they are.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "decode/npy.h"
#include "memory/batch_allocator.h"
#include "memory/byte_buffer_pool.h"
#include "pipeline/batch.h"
#include "pipeline/bounded_queue.h"
#include "pipeline/ordered_results.h"
#include "pipeline/stream_plan.h"
#include "pipeline/thread_group.h"
#include "tar/sample_reader.h"

namespace chute {

struct StreamStats {
  uint64_t shards_opened = 0;
  uint64_t samples_read = 0;     // grouped from the tar stream
  uint64_t samples_skipped = 0;  // dropped under the skip policy
  uint64_t samples_batched = 0;  // placed in a batch
  uint64_t batches = 0;          // batches handed to the consumer
  uint64_t samples_yielded = 0;  // rows of those batches
  uint64_t encoded_bytes = 0;    // payload bytes read
  uint64_t read_ns = 0;          // stream threads: reading + parsing + probing
  uint64_t decode_ns = 0;        // decode threads, summed
  uint64_t shuffle_bytes = 0;    // encoded bytes held in shuffle buffers now
  uint64_t shuffle_peak_bytes = 0;
  uint64_t shuffle_peak_samples = 0;
  int64_t queued_batches = 0;    // decoded, waiting for the consumer
  AllocatorStats memory;
};

class StreamEngine {
 public:
  explicit StreamEngine(StreamPlan plan);
  ~StreamEngine();
  StreamEngine(const StreamEngine&) = delete;
  StreamEngine& operator=(const StreamEngine&) = delete;

  // Next batch in order. kEnd when the epoch is over; rethrows the error of
  // the batch at this position. timeout_s <= 0 waits forever.
  OrderedResults::Status next(Batch* out, double timeout_s);

  // Stops all threads promptly; later next() calls return kClosed.
  void close();

  StreamStats stats() const;
  // Messages of samples skipped since the last call (for warn_and_continue).
  std::vector<std::string> take_skip_messages();
  BatchAllocator& allocator() { return allocator_; }

  struct ProbedField {
    int member = -1;  // index into EncodedSample::members, -1 when absent
    int height = 0;   // images
    int width = 0;
    NpyHeader npy{};  // npy
    int64_t label = 0;
  };
  struct PlannedSample {
    EncodedSample encoded;
    std::vector<ProbedField> fields;
  };

 private:
  struct StreamItem {
    std::vector<PlannedSample> samples;
    std::exception_ptr error;
    bool end = false;
  };
  struct BatchTask {
    int64_t sequence = 0;  // delivery order
    int64_t absolute = 0;  // position in the epoch, counting skipped (resumed) batches
    std::vector<PlannedSample> samples;
  };

  struct ShardJob;
  struct DecodeJob;
  void run_stream(int stream);
  void parse_shard(ShardJob& job, size_t chunk_size);
  void run_assembler();
  // False once the engine closed (the task is dropped).
  bool queue_for_decoding(BatchTask&& task);
  // No more tasks: decoders finish what is queued, then return.
  void end_decoding();
  void run_decoder();
  void allocate_batch(DecodeJob& job);
  void decode_rows(DecodeJob& job, size_t begin, size_t end);
  void finish_batch(DecodeJob& job);
  static void release_mapped_pages(const std::vector<PlannedSample>& samples);
  void probe(PlannedSample& sample) const;
  // Empty when compatible, else why not.
  std::string incompatibility(const PlannedSample& first, const PlannedSample& other) const;
  void record_skip(const std::string& message);
  std::vector<uint32_t> shard_order(int stream, int64_t pass) const;

  const StreamPlan plan_;
  BatchAllocator allocator_;
  ByteBufferPool payload_buffers_{size_t{64} << 20, size_t{4} << 20};
  OrderedResults results_;
  std::vector<std::unique_ptr<BoundedQueue<StreamItem>>> stream_queues_;
  std::atomic<bool> closed_{false};

  // Batches with pieces not yet taken, oldest first. The assembler's
  // results_.wait_for_slot bounds how many there are.
  std::mutex decode_mutex_;
  std::condition_variable decode_cv_;
  std::deque<std::shared_ptr<DecodeJob>> decode_queue_;
  bool decode_input_ended_ = false;

  mutable std::mutex skip_mutex_;
  std::deque<std::string> skip_messages_;

  std::atomic<uint64_t> shards_opened_{0}, samples_read_{0}, samples_skipped_{0},
      samples_batched_{0}, batches_{0}, samples_yielded_{0}, encoded_bytes_{0}, read_ns_{0}, decode_ns_{0},
      shuffle_bytes_{0}, shuffle_peak_bytes_{0}, shuffle_peak_samples_{0};

  ThreadGroup threads_;  // last: joined before the members above are destroyed
};

}  // namespace chute

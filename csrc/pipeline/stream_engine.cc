#include "pipeline/stream_engine.h"

#include <algorithm>
#include <deque>
#include <numeric>
#include <optional>
#include <thread>

#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "pipeline/selected_samples.h"
#include "pipeline/shard_schedule.h"
#include "pipeline/shuffle_buffer.h"

namespace chute {

namespace {

// Samples travel from parse threads to stream threads to the assembler in
// chunks of at most this many bytes (or of the chunk's sample count, or of
// one sample larger than this): enough to make a hand-off cheap, little
// enough that the queues between the threads hold a few MiB, not a few
// chunks of large samples.
constexpr size_t kChunkBytes = size_t{4} << 20;

// The machine's memory: a batch that needs more can never be formed.
uint64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

void update_max(std::atomic<uint64_t>& target, uint64_t value) {
  uint64_t current = target.load(std::memory_order_relaxed);
  while (value > current && !target.compare_exchange_weak(current, value)) {
  }
}

}  // namespace

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

StreamEngine::StreamEngine(StreamPlan plan)
    : plan_(std::move(plan)),
      sample_decoding_(sample_decoding_of(plan_)),
      results_(std::max<int64_t>(1, plan_.prefetch_batches), plan_.max_inflight_bytes) {
  CHUTE_CHECK(!plan_.urls.empty(), kUsage, "no shards to read");
  CHUTE_CHECK(plan_.sources != nullptr, kUsage, "the plan has no source factory");
  CHUTE_CHECK(plan_.batch_size >= 1, kUsage, "batch_size must be >= 1, got " << plan_.batch_size);
  CHUTE_CHECK(plan_.num_streams >= 1, kUsage, "streams must be >= 1");
  CHUTE_CHECK(plan_.num_threads >= 1, kUsage, "threads must be >= 1");
  CHUTE_CHECK(plan_.deliver_stride >= 1 && plan_.deliver_offset >= 0 &&
                  plan_.deliver_offset < plan_.deliver_stride,
              kUsage,
              "deliver_offset must be in [0, deliver_stride), got "
                  << plan_.deliver_offset << " of " << plan_.deliver_stride);
  CHUTE_CHECK(plan_.sample_ranges.size() <= plan_.urls.size(), kUsage,
              "sample ranges for " << plan_.sample_ranges.size() << " urls, but the plan has "
                                   << plan_.urls.size());
  for (const std::vector<int64_t>& ranges : plan_.sample_ranges) {
    const std::string why = SelectedSamples::invalid(ranges);
    CHUTE_CHECK(why.empty(), kUsage, "sample ranges: " << why);
  }
  for (const FieldPlan& f : plan_.fields) {
    CHUTE_CHECK(!f.extensions.empty(), kUsage, "field '" << f.name << "' names no extension");
  }
  allocator_.set_pin_hooks(plan_.pin);
  // More streams than shards would leave streams empty; never more than shards.
  const int streams = std::min<int>(plan_.num_streams, static_cast<int>(plan_.urls.size()));
  for (int s = 0; s < streams; ++s) {
    // Two chunks per stream keep the stream thread busy without holding much.
    stream_queues_.push_back(std::make_unique<BoundedQueue<StreamItem>>(2));
  }
  for (int s = 0; s < streams; ++s) threads_.spawn("chute-stream", [this, s] { run_stream(s); });
  threads_.spawn("chute-batch", [this] { run_assembler(); });
  for (int t = 0; t < plan_.num_threads; ++t) {
    threads_.spawn("chute-decode", [this] { decoding_.work(); });
  }
}

StreamEngine::~StreamEngine() {
  close();
  threads_.join();
}

void StreamEngine::close() {
  closed_.store(true);
  for (auto& q : stream_queues_) q->close();
  decoding_.close();
  results_.close();
}

OrderedResults::Status StreamEngine::next(Batch* out, double timeout_s) {
  const OrderedResults::Status status = results_.next(out, timeout_s);
  if (status == OrderedResults::Status::kBatch) delivered_.count(*out);
  return status;
}

// One shard being parsed ahead of its turn, on a thread of its own. Shards of
// a stream are parsed concurrently (several can be in flight) but consumed
// strictly in order, so parse parallelism never changes the sample order.
struct StreamEngine::ShardJob {
  struct Chunk {
    std::vector<PlannedSample> samples;
    std::exception_ptr error;
    bool end = false;
  };
  ShardJob(uint32_t shard_index, int64_t pass_index) : shard(shard_index), pass(pass_index) {}
  ~ShardJob() {
    chunks.close();
    if (thread.joinable()) thread.join();
  }
  uint32_t shard;
  int64_t pass;
  BoundedQueue<Chunk> chunks{4};
  std::thread thread;
};

void StreamEngine::parse_shard(ShardJob& job, size_t chunk_size) {
  std::vector<PlannedSample> buffer;
  size_t buffer_bytes = 0;
  buffer.reserve(chunk_size);
  auto push = [&](ShardJob::Chunk&& c) { return job.chunks.push(std::move(c)); };
  auto flush = [&]() -> bool {
    if (buffer.empty()) return true;
    ShardJob::Chunk c;
    c.samples.swap(buffer);
    buffer.reserve(chunk_size);
    buffer_bytes = 0;
    return push(std::move(c));
  };
  try {
    uint64_t t0 = now_ns();
    SourceOpenOptions options;
    options.in_place = plan_.shuffle_capacity == 0;
    options.cancel = &closed_;
    std::unique_ptr<SampleSource> source =
        plan_.sources->open(plan_.urls[job.shard], job.shard, options);
    if (job.shard < plan_.sample_ranges.size() && !plan_.sample_ranges[job.shard].empty()) {
      source = std::make_unique<SelectedSamples>(
          std::move(source), plan_.sample_ranges[job.shard], plan_.urls[job.shard]);
    }
    shards_opened_.fetch_add(1);
    auto payload_buffer = [&] {
      return source->in_place() ? std::vector<uint8_t>() : payload_buffers_.take();
    };
    PlannedSample sample;
    sample.encoded.data = payload_buffer();
    const bool raise = plan_.on_error == ErrorPolicy::kRaise;
    bool last_dropped = false;  // the sample read last was dropped here
    while (!closed_.load(std::memory_order_relaxed)) {
      bool more = false;
      try {
        more = source->next(sample.encoded);
      } catch (const Error& e) {
        if (raise || closed_.load()) throw;
        SampleSource::Failure cost = source->failure();
        // An end counts one sample, the one it may have cut short: the
        // sample read last, if it was dropped here (for what it lacked) and
        // so counted already. An error that lost a sample of its own is
        // about another.
        if (!cost.resumable && last_dropped && cost.samples_lost > 0) cost.samples_lost -= 1;
        if (!cost.resumable || cost.samples_lost > 0) last_dropped = false;
        record_formation_skip(e, cost.samples_lost);
        if (cost.resumable) continue;
        break;
      }
      if (!more) break;
      // Under raise a flawed sample is not delivered: its fault is raised
      // in its place (the source throws it now).
      if (sample.encoded.flawed && raise) source->next(sample.encoded);
      samples_read_.fetch_add(1, std::memory_order_relaxed);
      encoded_bytes_.fetch_add(sample.encoded.payload_bytes, std::memory_order_relaxed);
      last_dropped = false;
      try {
        fields_.probe(sample);
      } catch (const Error& e) {
        if (raise) throw;
        record_formation_skip(e);
        last_dropped = true;
        continue;
      }
      // A sample that waits in a shuffle buffer holds its buffer all that
      // time: not one much larger than its payload (a reused one can be).
      std::vector<uint8_t>& data = sample.encoded.data;
      if (plan_.shuffle_capacity > 0 && data.capacity() > 2 * data.size() + 4096) {
        data.shrink_to_fit();
      }
      buffer_bytes += sample.encoded.held_bytes();
      buffer.push_back(std::move(sample));
      sample = PlannedSample();
      sample.encoded.data = payload_buffer();
      if (buffer.size() >= chunk_size || buffer_bytes >= kChunkBytes) {
        read_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
        if (!flush()) return;
        t0 = now_ns();
      }
    }
    read_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
    if (!flush()) return;
    ShardJob::Chunk end;
    end.end = true;
    push(std::move(end));
  } catch (const Error& e) {
    // Samples already parsed still reach the consumer. Under raise the
    // error travels to the consumer; under the skip policy (a shard that
    // does not open) the shard is lost and counted here as one sample.
    if (!flush()) return;
    if (closed_.load()) return;  // a read the closing engine cancelled
    ShardJob::Chunk last;
    if (plan_.on_error == ErrorPolicy::kSkip) {
      record_formation_skip(e);
      last.end = true;
    } else {
      last.error = std::current_exception();
    }
    push(std::move(last));
  } catch (...) {
    if (!flush()) return;
    ShardJob::Chunk failure;
    failure.error = std::current_exception();
    push(std::move(failure));
  }
}

void StreamEngine::run_stream(int stream) {
  BoundedQueue<StreamItem>& queue = *stream_queues_[static_cast<size_t>(stream)];
  const size_t chunk = static_cast<size_t>(std::clamp<int64_t>(plan_.batch_size, 16, 1024));
  ShuffleBuffer<PlannedSample> shuffle(
      plan_.shuffle_capacity, plan_.shuffle_initial, plan_.shuffle_max_bytes,
      stream_shuffle_seed(plan_.seed, plan_.epoch, static_cast<uint64_t>(stream)));
  StreamItem item;
  size_t item_bytes = 0;
  auto flush = [&]() -> bool {
    if (item.samples.empty()) return true;
    StreamItem out;
    out.samples.swap(item.samples);
    item.samples.reserve(chunk);
    item_bytes = 0;
    return queue.push(std::move(out));
  };
  auto emit = [&](PlannedSample&& s) -> bool {
    item_bytes += s.encoded.held_bytes();
    item.samples.push_back(std::move(s));
    return (item.samples.size() < chunk && item_bytes < kChunkBytes) || flush();
  };
  auto account_shuffle = [&] {
    shuffle_bytes_.store(shuffle.bytes());
    update_max(shuffle_peak_bytes_, shuffle.peak_bytes());
    update_max(shuffle_peak_samples_, shuffle.peak_items());
  };

  ShardScheduleSpec spec;
  spec.num_shards = plan_.urls.size();
  spec.stream = static_cast<size_t>(stream);
  spec.num_streams = stream_queues_.size();
  spec.shuffle = plan_.shuffle_shards;
  spec.repeat = plan_.repeat;
  spec.resampled = plan_.resampled;
  spec.seed = plan_.seed;
  spec.epoch = plan_.epoch;
  ShardSchedule schedule(spec);
  std::deque<std::unique_ptr<ShardJob>> jobs;
  auto top_up = [&] {
    uint32_t shard;
    int64_t shard_pass;
    while (jobs.size() < static_cast<size_t>(std::max(1, plan_.parse_ahead)) &&
           schedule.next(&shard, &shard_pass)) {
      auto job = std::make_unique<ShardJob>(shard, shard_pass);
      ShardJob* raw = job.get();
      raw->thread = ThreadGroup::named("chute-parse", [this, raw, chunk] {
        parse_shard(*raw, chunk);
        // Whatever way the parser ended, the stream thread must not wait for
        // more: after the last chunk, pop() reports the queue closed.
        raw->chunks.close();
      });
      jobs.push_back(std::move(job));
    }
  };
  try {
    int64_t current_pass = 0;
    uint64_t samples_this_pass = 0;
    top_up();
    while (!jobs.empty() && !closed_.load()) {
      ShardJob& job = *jobs.front();
      if (job.pass != current_pass) {
        // A whole pass without a sample: repeating would spin forever.
        if (samples_this_pass == 0) break;
        current_pass = job.pass;
        samples_this_pass = 0;
      }
      bool shard_done = false;
      while (!shard_done) {
        std::optional<ShardJob::Chunk> c = job.chunks.pop();
        if (!c) return;  // closed
        if (c->error) std::rethrow_exception(c->error);  // skips were settled by the parser
        shard_done = shard_done || c->end;
        for (PlannedSample& sample : c->samples) {
          samples_this_pass += 1;
          const size_t bytes = sample.encoded.encoded_bytes();
          const bool ok = shuffle.enabled() ? shuffle.feed(std::move(sample), bytes, emit)
                                            : emit(std::move(sample));
          if (!ok) return;  // closed
        }
        if (shuffle.enabled()) account_shuffle();
      }
      jobs.pop_front();
      top_up();
    }
    jobs.clear();
    PlannedSample out;
    while (shuffle.pop(&out)) {
      if (!emit(std::move(out))) return;
    }
    account_shuffle();
    if (!flush()) return;
    StreamItem end;
    end.end = true;
    queue.push(std::move(end));
  } catch (...) {
    jobs.clear();
    if (!flush()) return;
    StreamItem failure;
    failure.error = std::current_exception();
    queue.push(std::move(failure));
  }
}

void StreamEngine::run_assembler() {
  const size_t streams = stream_queues_.size();
  std::vector<std::deque<PlannedSample>> pending(streams);
  std::vector<bool> ended(streams, false);
  std::vector<size_t> active(streams);
  std::iota(active.begin(), active.end(), 0);
  int64_t sequence = 0;  // batches delivered
  int64_t formed = 0;    // batches formed, including skipped ones
  size_t turn = 0;
  const size_t batch_size = static_cast<size_t>(plan_.batch_size);
  auto fail = [&](std::exception_ptr error) {
    if (results_.wait_for_slot(sequence)) {
      results_.put_error(sequence, std::move(error));
      results_.finish(sequence + 1);
    }
  };
  try {
    while (!active.empty() && !closed_.load() &&
           (plan_.max_batches < 0 || formed < plan_.max_batches)) {
      const size_t slot = turn % active.size();
      const size_t s = active[slot];
      BatchTask task;
      // A batch fills as samples come: reserving batch_size up front would
      // ask for memory that a short epoch never uses.
      task.samples.reserve(std::min<size_t>(batch_size, 1024));
      size_t task_bytes = 0;   // encoded, for max_batch_bytes
      uint64_t cost = 0;       // encoded and decoded, for the bytes in flight
      bool cut = false;        // by max_batch_bytes
      while (task.samples.size() < batch_size && !cut) {
        if (pending[s].empty()) {
          if (ended[s]) break;
          std::optional<StreamItem> item = stream_queues_[s]->pop();
          if (!item) return;  // closed
          if (item->error) {
            // Samples handed out one by one: those before the error are
            // the consumer's before it, as they would be one at a time.
            if (plan_.samples_one_by_one && !task.samples.empty()) {
              task.epoch = plan_.epoch;
              task.absolute = formed++;
              if (delivers(task.absolute)) {
                if (!results_.wait_for_slot(sequence, cost)) return;
                task.sequence = sequence++;
                if (!queue_for_decoding(std::move(task))) return;
              }
            }
            fail(item->error);
            decoding_.end();
            return;
          }
          if (item->end) {
            ended[s] = true;
            break;
          }
          for (PlannedSample& ps : item->samples) pending[s].push_back(std::move(ps));
          continue;
        }
        PlannedSample sample = std::move(pending[s].front());
        pending[s].pop_front();
        if (!task.samples.empty()) {
          std::optional<Error> misfit = fields_.incompatibility(task.samples.front(), sample);
          if (misfit) {
            if (plan_.on_error == ErrorPolicy::kRaise) {
              fail(std::make_exception_ptr(*misfit));
              decoding_.end();
              return;
            }
            record_formation_skip(*misfit);
            continue;
          }
        }
        const size_t held = sample.encoded.held_bytes();
        const size_t decoded = fields_.decoded_bytes(sample);
        if (formed == 0 && task.samples.empty()) check_batch_fits(held + decoded);
        task_bytes += held;
        cost += held + decoded;
        task.samples.push_back(std::move(sample));
        cut = plan_.max_batch_bytes > 0 && task_bytes >= plan_.max_batch_bytes;
      }
      task.epoch = plan_.epoch;
      const bool full = task.samples.size() == batch_size || cut;
      if (full || (plan_.partial && !task.samples.empty())) {
        task.absolute = formed++;
        if (delivers(task.absolute)) {
          if (!results_.wait_for_slot(sequence, cost)) return;
          task.sequence = sequence++;
          if (!queue_for_decoding(std::move(task))) return;
        }
      }
      if (ended[s] && pending[s].empty()) {
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(slot));
      } else {
        turn = slot + 1;
      }
    }
    results_.finish(sequence);
  } catch (...) {
    fail(std::current_exception());
  }
  // Stop the stream threads (a capped epoch leaves them mid-shard) and let the
  // decoders drain what was queued.
  for (auto& q : stream_queues_) q->close();
  decoding_.end();
}

bool StreamEngine::delivers(int64_t absolute) const {
  return absolute >= plan_.skip_batches && absolute % plan_.deliver_stride == plan_.deliver_offset;
}

void StreamEngine::record_formation_skip(const Error& error, uint64_t samples_lost) {
  if (plan_.deliver_offset == 0) skips_.record(error, samples_lost);
}

void StreamEngine::check_batch_fits(size_t sample_bytes) const {
  // Samples of a shard are alike: if batch_size of the first one cannot fit
  // in the machine, the first full batch would fail to allocate, after
  // holding the whole epoch's samples while it waited for them.
  const uint64_t memory = physical_memory();
  const auto rows = static_cast<uint64_t>(plan_.batch_size);
  if (memory == 0 || plan_.max_batch_bytes > 0 || rows <= 1) return;
  const uint64_t per_row = std::max<uint64_t>(1, sample_bytes);
  CHUTE_CHECK(rows <= memory / per_row, kUsage,
              "batch_size " << rows << " cannot fit: a batch of samples like the first one ("
                            << sample_bytes << " bytes each, encoded and decoded) needs about "
                            << (rows > UINT64_MAX / per_row ? std::string("more than 2^64")
                                                            : std::to_string(rows * per_row))
                            << " bytes, more than the " << memory
                            << " bytes of memory of this machine");
}

bool StreamEngine::queue_for_decoding(BatchTask&& task) {
  if (closed_.load()) return false;
  samples_batched_.fetch_add(task.samples.size());
  batches_submitted_.fetch_add(1);
  return decoding_.push(std::make_shared<StreamBatchJob>(batch_context_, std::move(task)));
}

EngineStats StreamEngine::stats() const {
  EngineStats s;
  delivered_.fill(s);
  s.batches_submitted = batches_submitted_.load();
  s.queued_batches = results_.ready_count();
  s.samples_read = samples_read_.load();
  s.samples_skipped = skips_.count();
  s.samples_batched = samples_batched_.load();
  s.shards_opened = shards_opened_.load();
  s.encoded_bytes = encoded_bytes_.load();
  s.read_ns = read_ns_.load();
  s.decode_ns = decoding_.busy_ns();
  s.shuffle_bytes = shuffle_bytes_.load();
  s.shuffle_peak_bytes = shuffle_peak_bytes_.load();
  s.shuffle_peak_samples = shuffle_peak_samples_.load();
  s.memory = allocator_.stats();
  return s;
}

}  // namespace chute

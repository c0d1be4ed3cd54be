#include "engine/stream_engine.h"

#include <algorithm>
#include <deque>
#include <numeric>
#include <optional>
#include <thread>

#include "batching/batch_fit.h"
#include "core/clock.h"
#include "core/error.h"
#include "schedule/shard_schedule.h"
#include "schedule/shuffle_buffer.h"
#include "sources/source_losses.h"

namespace chute {

StreamEngine::StreamEngine(StreamPlan plan)
    : plan_(std::move(plan)),
      sample_decoding_(sample_decoding_of(plan_)),
      results_(std::max<int64_t>(1, plan_.prefetch_batches), plan_.max_inflight_bytes) {
  check_stream_plan(plan_);
  allocator_.set_pin_hooks(plan_.pin);
  // More streams than shards would leave streams empty; never more than shards.
  const int streams = std::min<int>(plan_.num_streams, static_cast<int>(plan_.urls.size()));
  for (int s = 0; s < streams; ++s) {
    // Two chunks per stream keep the stream thread busy without holding much.
    stream_queues_.push_back(std::make_unique<BoundedQueue<SampleChunk>>(2));
    pass_requests_.push_back(std::make_unique<BoundedQueue<int64_t>>(1));
  }
  for (int s = 0; s < streams; ++s) threads_.spawn("chute-stream", [this, s] { run_stream(s); });
  threads_.spawn("chute-batch", [this] { run_assembler(); });
  for (int t = 0; t < plan_.num_threads; ++t) {
    threads_.spawn("chute-decode", [this] { decoding_.work(); });
  }
}

StreamEngine::~StreamEngine() { close(); }

void StreamEngine::close() {
  closed_.store(true);
  for (auto& q : stream_queues_) q->close();
  for (auto& q : pass_requests_) q->close();
  decoding_.close();
  results_.close();
  threads_.join();
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
  ShardJob(uint32_t shard_index, int64_t pass_index) : shard(shard_index), pass(pass_index) {}
  ~ShardJob() {
    chunks.close();
    if (thread.joinable()) thread.join();
  }
  uint32_t shard;
  int64_t pass;
  BoundedQueue<SampleChunk> chunks{4};
  std::thread thread;
};

// The threads hand an error on only after its catch block has ended (and
// move it, never copy): this thread has then let go of the exception and the
// consumer's thread frees it. libstdc++ counts an exception's references with
// atomics that ThreadSanitizer cannot see, so an exception freed by a thread
// that caught it after the consumer read it reads as a race.
void StreamEngine::parse_shard(ShardJob& job, size_t chunk_size) {
  ChunkFiller filler(chunk_size);
  std::exception_ptr failure;
  // What fails while the shard is opened or read (the source's own errors,
  // and those of the files, pipes and stores under it) is a read failure of
  // this url, whichever layer raised it.
  const ErrorPlace shard_place{plan_.urls[job.shard], "", ""};
  auto read_failure = [&](const Error& e) { return e.scoped(ErrorScope::kRead, shard_place); };
  try {
    uint64_t t0 = now_ns();
    std::unique_ptr<SampleSource> source;
    try {
      source = open_planned_shard(plan_, job.shard, &closed_);
    } catch (const Error& e) {
      throw read_failure(e);
    }
    counters_.shard_opened();
    auto payload_buffer = [&] {
      return source->in_place() ? std::vector<uint8_t>() : payload_buffers_.take();
    };
    PlannedSample sample;
    sample.encoded.data = payload_buffer();
    const bool raise = plan_.on_error == ErrorPolicy::kRaise;
    SourceLosses losses;
    while (!closed_.load(std::memory_order_relaxed)) {
      bool more = false;
      try {
        more = source->next(sample.encoded);
        // Under raise a flawed sample is not delivered: its fault is raised
        // in its place (the source throws it now).
        if (more && sample.encoded.flawed && raise) source->next(sample.encoded);
      } catch (const Error& e) {
        if (raise || closed_.load()) throw read_failure(e);
        const SampleSource::Failure cost = source->failure();
        record_formation_skip(read_failure(e), losses.uncounted(cost));
        if (cost.resumable) continue;
        break;
      }
      if (!more) break;
      counters_.sample_read(sample.encoded);
      losses.kept();
      try {
        fields_.probe(sample);
      } catch (const Error& e) {
        if (raise) throw;
        record_formation_skip(e);
        losses.dropped();
        continue;
      }
      // A sample that waits in a shuffle buffer holds its buffer all that
      // time: not one much larger than its payload (a reused one can be).
      std::vector<uint8_t>& data = sample.encoded.data;
      if (plan_.shuffle_capacity > 0 && data.capacity() > 2 * data.size() + 4096) {
        data.shrink_to_fit();
      }
      const bool full = filler.add(std::move(sample));
      sample = PlannedSample();
      sample.encoded.data = payload_buffer();
      if (full) {
        counters_.read_time(now_ns() - t0);
        if (!filler.flush_to(job.chunks)) return;
        t0 = now_ns();
      }
    }
    counters_.read_time(now_ns() - t0);
    if (!filler.flush_to(job.chunks)) return;
    job.chunks.push(SampleChunk::ending());
  } catch (const Error& e) {
    // Samples already parsed still reach the consumer. Under raise the
    // error travels to the consumer; under the skip policy (a shard that
    // does not open) the shard is lost and counted here as one sample.
    if (!filler.flush_to(job.chunks)) return;
    if (closed_.load()) return;  // a read the closing engine cancelled
    if (plan_.on_error == ErrorPolicy::kSkip) {
      record_formation_skip(e);
      job.chunks.push(SampleChunk::ending());
    } else {
      failure = std::current_exception();
    }
  } catch (...) {
    if (!filler.flush_to(job.chunks)) return;
    failure = std::current_exception();
  }
  if (failure) job.chunks.push(SampleChunk::failure(std::move(failure)));
}

void StreamEngine::run_stream(int stream) {
  BoundedQueue<SampleChunk>& queue = *stream_queues_[static_cast<size_t>(stream)];
  const size_t chunk = static_cast<size_t>(std::clamp<int64_t>(plan_.batch_size, 16, 1024));
  ShuffleBuffer<PlannedSample> shuffle(
      plan_.shuffle_capacity, plan_.shuffle_initial, plan_.shuffle_max_bytes,
      stream_shuffle_seed(plan_.seed, plan_.epoch, static_cast<uint64_t>(stream)));
  ChunkFiller filler(chunk);
  auto emit = [&](PlannedSample&& s) -> bool {
    return !filler.add(std::move(s)) || filler.flush_to(queue);
  };
  StreamCounters::ShuffleLevel reported;
  auto account_shuffle = [&] {
    counters_.shuffle(reported, {shuffle.bytes(), shuffle.size()}, shuffle.peak_bytes(),
                      shuffle.peak_items());
  };

  ShardSchedule schedule(
      shard_schedule_of(plan_, static_cast<size_t>(stream), stream_queues_.size()));
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
  std::exception_ptr failure;  // see parse_shard
  try {
    int64_t current_pass = 0;
    uint64_t samples_this_pass = 0;
    top_up();
    while (true) {
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
          std::optional<SampleChunk> c = job.chunks.pop();
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
      if (!filler.flush_to(queue)) return;
      if (!queue.push(SampleChunk::ending())) return;
      if (!plan_.repeat_to_limit) return;
      // The pass is out: the next begins only when the assembler has formed
      // the last batches of this one on every stream and wants more.
      std::optional<int64_t> next = pass_requests_[static_cast<size_t>(stream)]->pop();
      if (!next) return;  // the epoch is over
      schedule.next_pass();
      ++current_pass;
      samples_this_pass = 0;
      top_up();
    }
  } catch (...) {
    jobs.clear();
    if (!filler.flush_to(queue)) return;
    failure = std::current_exception();
  }
  if (failure) queue.push(SampleChunk::failure(std::move(failure)));
}

void StreamEngine::run_assembler() {
  const size_t streams = stream_queues_.size();
  std::vector<std::deque<PlannedSample>> pending(streams);
  std::vector<bool> ended(streams, false);
  std::vector<size_t> active(streams);
  std::iota(active.begin(), active.end(), 0);
  int64_t sequence = 0;  // batches delivered
  int64_t formed = 0;    // batches formed, including skipped ones
  int64_t samples_formed = 0;  // in those batches
  int64_t pass = 0;            // over the shard list (repeat_to_limit)
  int64_t formed_before_pass = 0;
  size_t turn = 0;
  const size_t batch_size = static_cast<size_t>(plan_.batch_size);
  auto limit_reached = [&] {
    return (plan_.max_batches >= 0 && formed >= plan_.max_batches) ||
           (plan_.max_samples >= 0 && samples_formed >= plan_.max_samples);
  };
  auto fail = [&](std::exception_ptr error) {
    if (results_.wait_for_slot(sequence)) {
      results_.put_error(sequence, std::move(error));
      results_.finish(sequence + 1);
    }
  };
  // Numbers a formed batch and, when it is delivered here, queues it for
  // decoding once a slot frees (`cost`: its bytes in flight). False once the
  // engine closed.
  auto submit = [&](BatchTask&& task, uint64_t cost) -> bool {
    task.epoch = plan_.epoch;
    task.absolute = formed++;
    samples_formed += static_cast<int64_t>(task.samples.size());
    batches_formed_.store(formed);
    if (!delivers(task.absolute)) return true;
    if (pass > 0) counters_.samples_repeated(task.samples.size());
    if (!results_.wait_for_slot(sequence, cost)) return false;
    task.sequence = sequence++;
    return queue_for_decoding(std::move(task));
  };
  std::exception_ptr failure;
  try {
    while (!closed_.load() && !limit_reached()) {
      if (active.empty()) {
        // Every stream's pass is batched: another one only when the limit
        // asks for it and this one formed a batch (else they would spin).
        if (!plan_.repeat_to_limit || formed == formed_before_pass) break;
        ++pass;
        formed_before_pass = formed;
        for (size_t st = 0; st < streams; ++st) {
          if (!pass_requests_[st]->push(pass)) return;  // closed
          ended[st] = false;
          active.push_back(st);
        }
        turn = 0;
        continue;
      }
      const size_t slot = turn % active.size();
      const size_t s = active[slot];
      BatchTask task;
      // A batch fills as samples come: reserving batch_size up front would
      // ask for memory that a short epoch never uses.
      task.samples.reserve(std::min<size_t>(batch_size, 1024));
      size_t task_bytes = 0;   // encoded, for max_batch_bytes
      uint64_t cost = 0;       // encoded and decoded, for the bytes in flight
      bool cut = false;        // by max_batch_bytes
      // The batch that reaches max_samples holds only the samples left.
      const size_t wanted =
          plan_.max_samples < 0
              ? batch_size
              : std::min(batch_size, static_cast<size_t>(plan_.max_samples - samples_formed));
      while (task.samples.size() < wanted && !cut) {
        if (pending[s].empty()) {
          if (ended[s]) break;
          std::optional<SampleChunk> item = stream_queues_[s]->pop();
          if (!item) return;  // closed
          if (item->error) {
            // Samples handed out one by one: those before the error are
            // the consumer's before it, as they would be one at a time.
            if (plan_.samples_one_by_one && !task.samples.empty()) {
              if (!submit(std::move(task), cost)) return;
            }
            fail(std::move(item->error));  // see parse_shard
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
        if (formed == 0 && task.samples.empty()) {
          check_batch_fits(plan_.batch_size, plan_.max_batch_bytes, held + decoded,
                           physical_memory());
        }
        task_bytes += held;
        cost += held + decoded;
        task.samples.push_back(std::move(sample));
        cut = plan_.max_batch_bytes > 0 && task_bytes >= plan_.max_batch_bytes;
      }
      const bool full = task.samples.size() == wanted || cut;
      if (full || (plan_.partial && !task.samples.empty())) {
        if (!submit(std::move(task), cost)) return;
      }
      if (ended[s] && pending[s].empty()) {
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(slot));
      } else {
        turn = slot + 1;
      }
    }
    results_.finish(sequence);
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) fail(std::move(failure));  // see parse_shard
  // Stop the stream threads (a capped epoch leaves them mid-shard or waiting
  // for another pass) and let the decoders drain what was queued.
  for (auto& q : stream_queues_) q->close();
  for (auto& q : pass_requests_) q->close();
  decoding_.end();
}

bool StreamEngine::delivers(int64_t absolute) const {
  return absolute >= plan_.skip_batches && absolute % plan_.deliver_stride == plan_.deliver_offset;
}

void StreamEngine::record_formation_skip(const Error& error, uint64_t samples_lost) {
  if (plan_.deliver_offset == 0) skips_.record(error, samples_lost);
}

bool StreamEngine::queue_for_decoding(BatchTask&& task) {
  if (closed_.load()) return false;
  counters_.batch_submitted(task.samples.size());
  return decoding_.push(std::make_shared<StreamBatchJob>(batch_context_, std::move(task)));
}

EngineStats StreamEngine::stats() const {
  EngineStats s;
  delivered_.fill(s);
  counters_.fill(s);
  s.queued_batches = results_.ready_count();
  s.samples_skipped = skips_.count();
  fill_worker_figures(decoding_, results_, s);
  s.memory = allocator_.stats();
  return s;
}

void StreamEngine::set_active_threads(int threads, int64_t in_flight) {
  decoding_.set_active_limit(threads);
  results_.set_max_in_flight(in_flight);
}

}  // namespace chute

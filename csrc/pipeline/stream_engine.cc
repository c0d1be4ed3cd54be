#include "pipeline/stream_engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "core/error.h"
#include "decode/label.h"
#include "pipeline/random.h"
#include "pipeline/shuffle_buffer.h"

namespace chute {

namespace {

constexpr size_t kMaxSkipMessages = 1000;
const std::string kNoWhere;  // decoders get context added by with_context

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void update_max(std::atomic<uint64_t>& target, uint64_t value) {
  uint64_t current = target.load(std::memory_order_relaxed);
  while (value > current && !target.compare_exchange_weak(current, value)) {
  }
}

std::string member_location(const StreamPlan& plan, const EncodedSample& sample,
                            const SampleMember* member) {
  std::ostringstream os;
  os << "shard '" << plan.urls[sample.source_index] << "'";
  if (member != nullptr) {
    os << ", member '" << member->name << "' at offset " << member->header_offset;
  } else {
    os << ", sample '" << sample.key << "' at offset " << sample.offset;
  }
  return os.str();
}

// kData, as for a tar archive found truncated when read (this one was cut
// while mapped).
Error lost_error(const StreamPlan& plan, const EncodedSample& sample) {
  std::ostringstream os;
  if (sample.key.empty()) {
    os << "shard '" << plan.urls[sample.source_index] << "'";
  } else {
    os << member_location(plan, sample, nullptr);
  }
  os << ": truncated tar archive: the file shrank while it was being read (cut or rewritten in"
     << " place; it now ends at offset " << sample.mapping->valid_size()
     << "), so the samples past that are gone";
  return Error(ErrorKind::kData, os.str(), __FILE__, __LINE__);
}

// Whether bytes this thread read of `sample` in place were zeros from a file
// that shrank; looks at the file's size now.
bool read_lost(const EncodedSample& sample) {
  if (!sample.mapping) return false;
  sample.mapping->check_size();
  return sample.lost();
}

// Runs fn, which reads `sample`; a chute::Error from it is rethrown with the
// location in front. The location is built only on failure: formatting it
// for every sample would cost more than decoding a small one. A sample read
// in place from a file that shrank meanwhile fails as such, whatever fn made
// of the zeros it read (see MappedFile). Success is checked by the caller,
// once for many samples.
template <typename Fn>
void with_context(const StreamPlan& plan, const EncodedSample& sample, const SampleMember* member,
                  Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    if (read_lost(sample)) throw lost_error(plan, sample);
    throw Error(e.kind(), member_location(plan, sample, member) + ": " + e.message(), __FILE__,
                __LINE__);
  }
}

// reader.next(), reporting a file that shrank under its mapping as such: the
// zeros read from it parse as a bad header or as the end of the archive. (A
// sample's own bytes are checked after it is decoded.)
bool next_sample(const StreamPlan& plan, SampleReader& reader, EncodedSample& out) {
  bool more = false;
  try {
    more = reader.next(out);
  } catch (const Error&) {
    if (out.mapping && out.mapping->check_size()) throw lost_error(plan, out);
    throw;
  }
  if (!more && out.mapping && out.mapping->check_size()) throw lost_error(plan, out);
  return more;
}

int image_channels(const FieldPlan& f) { return f.color == ColorMode::kGray ? 1 : 3; }

// Output shape of one image row.
std::vector<int64_t> image_row_shape(const FieldPlan& f, int height, int width) {
  const int64_t h = f.image.out_height > 0 ? f.image.out_height : height;
  const int64_t w = f.image.out_width > 0 ? f.image.out_width : width;
  const int64_t c = image_channels(f);
  if (c == 1 && f.image.squeeze_gray) return {h, w};
  return f.image.chw ? std::vector<int64_t>{c, h, w} : std::vector<int64_t>{h, w, c};
}

std::vector<int64_t> row_shape(const FieldPlan& f, const StreamEngine::ProbedField& p) {
  switch (f.decoder) {
    case FieldDecoder::kImage:
      return image_row_shape(f, p.height, p.width);
    case FieldDecoder::kNpy:
      return p.npy.shape;
    case FieldDecoder::kInt:
      return {};
    case FieldDecoder::kRaw:
      return {};
  }
  return {};
}

DType row_dtype(const FieldPlan& f, const StreamEngine::ProbedField& p) {
  switch (f.decoder) {
    case FieldDecoder::kImage:
      return f.image.to_float ? DType::kF32 : DType::kU8;
    case FieldDecoder::kNpy:
      return p.npy.dtype;
    case FieldDecoder::kInt:
      return DType::kI64;
    case FieldDecoder::kRaw:
      return DType::kU8;
  }
  return DType::kU8;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) os << ",";
  os << ")";
  return os.str();
}

// Decodes one image into `out` (a row of the batch) per the field's spec.
void decode_image_row(const FieldPlan& f, const uint8_t* data, size_t size, int height, int width,
                      uint64_t crop_seed, void* out) {
  thread_local std::vector<uint8_t> decoded;
  thread_local std::vector<uint8_t> resized;
  const int c = image_channels(f);
  ImageOutputSpec spec = f.image;
  spec.channels = c;
  const bool plain_copy = spec.out_height == 0 && !spec.chw && !spec.to_float && !spec.random_flip;
  if (plain_copy) {
    decode_image(data, size, f.color, static_cast<uint8_t*>(out), kNoWhere);
    return;
  }
  Rng rng(crop_seed);
  if (spec.out_height == 0) {
    // No resize: layout, dtype and flip happen row group by row group while
    // the decoder's rows are in L1, not in a second pass over a whole image.
    // (The window is the whole image; the rng draws only the flip, as below.)
    const bool flip = spec.random_flip && (rng.next() & 1);
    ImageWriter writer(height, width, spec, 0, 0, flip, out);
    decode_image_rows(data, size, f.color, writer, kNoWhere);
    return;
  }
  decoded.resize(static_cast<size_t>(height) * width * c);
  decode_image(data, size, f.color, decoded.data(), kNoWhere);
  const uint8_t* src = decoded.data();
  int h = height;
  int w = width;
  if (spec.out_height > 0) {
    const ImageSize target = resize_target(height, width, spec);
    if (target.height != h || target.width != w) {
      resized.resize(static_cast<size_t>(target.height) * target.width * c);
      resize_bilinear(src, h, w, c, resized.data(), target.height, target.width);
      src = resized.data();
      h = target.height;
      w = target.width;
    }
  }
  int crop_y = 0;
  int crop_x = 0;
  if (spec.crop == CropMode::kRandom && spec.out_height > 0) {
    crop_y = static_cast<int>(rng.below(static_cast<uint64_t>(h - spec.out_height) + 1));
    crop_x = static_cast<int>(rng.below(static_cast<uint64_t>(w - spec.out_width) + 1));
  } else {
    center_crop_origin(h, w, spec, &crop_y, &crop_x);
  }
  const bool flip = spec.random_flip && (rng.next() & 1);
  write_image_output(src, h, w, spec, crop_y, crop_x, flip, out);
}

}  // namespace

StreamEngine::StreamEngine(StreamPlan plan)
    : plan_(std::move(plan)),
      results_(std::max<int64_t>(1, plan_.prefetch_batches)) {
  CHUTE_CHECK(!plan_.urls.empty(), kUsage, "no shards to read");
  CHUTE_CHECK(plan_.batch_size >= 1, kUsage, "batch_size must be >= 1, got " << plan_.batch_size);
  CHUTE_CHECK(plan_.num_streams >= 1, kUsage, "streams must be >= 1");
  CHUTE_CHECK(plan_.num_threads >= 1, kUsage, "threads must be >= 1");
  for (const FieldPlan& f : plan_.fields) {
    CHUTE_CHECK(!f.extensions.empty(), kUsage, "field '" << f.name << "' names no extension");
    if (f.decoder == FieldDecoder::kImage && f.image.out_height > 0) {
      CHUTE_CHECK(f.image.out_width > 0, kUsage, "field '" << f.name << "': output size needs both height and width");
    }
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
  for (int t = 0; t < plan_.num_threads; ++t) threads_.spawn("chute-decode", [this] { run_decoder(); });
}

StreamEngine::~StreamEngine() {
  close();
  threads_.join();
}

void StreamEngine::close() {
  closed_.store(true);
  for (auto& q : stream_queues_) q->close();
  {
    std::lock_guard<std::mutex> lock(decode_mutex_);
    decode_queue_.clear();
    decode_input_ended_ = true;
  }
  decode_cv_.notify_all();
  results_.close();
}

OrderedResults::Status StreamEngine::next(Batch* out, double timeout_s) {
  OrderedResults::Status status = results_.next(out, timeout_s);
  if (status == OrderedResults::Status::kBatch) {
    batches_.fetch_add(1);
    samples_yielded_.fetch_add(static_cast<uint64_t>(out->size));
  }
  return status;
}

std::vector<uint32_t> StreamEngine::shard_order(int stream, int64_t pass) const {
  std::vector<uint32_t> all(plan_.urls.size());
  std::iota(all.begin(), all.end(), 0u);
  if (plan_.shuffle_shards) {
    // One permutation for all streams, so streams stay disjoint.
    Rng rng(derive_seed({plan_.seed, static_cast<uint64_t>(plan_.epoch),
                         static_cast<uint64_t>(pass), 0x5348415244ULL}));
    for (size_t i = all.size(); i > 1; --i) std::swap(all[i - 1], all[rng.below(i)]);
  }
  std::vector<uint32_t> mine;
  const size_t streams = stream_queues_.size();
  for (size_t i = static_cast<size_t>(stream); i < all.size(); i += streams) mine.push_back(all[i]);
  return mine;
}

void StreamEngine::probe(PlannedSample& sample) const {
  const EncodedSample& enc = sample.encoded;
  sample.fields.resize(plan_.fields.size());
  for (size_t i = 0; i < plan_.fields.size(); ++i) {
    const FieldPlan& f = plan_.fields[i];
    ProbedField& p = sample.fields[i];
    p.member = -1;
    for (const std::string& ext : f.extensions) {
      for (size_t m = 0; m < enc.members.size(); ++m) {
        if (enc.members[m].extension == ext) {
          p.member = static_cast<int>(m);
          break;
        }
      }
      if (p.member >= 0) break;
    }
    if (p.member < 0) {
      if (f.optional) continue;
      std::ostringstream names;
      for (size_t m = 0; m < enc.members.size(); ++m) names << (m ? ", " : "") << enc.members[m].extension;
      CHUTE_CHECK(false, kData, member_location(plan_, enc, nullptr)
                                    << ": field '" << f.name << "' not found (wanted one of "
                                    << [&] {
                                         std::string s;
                                         for (size_t k = 0; k < f.extensions.size(); ++k)
                                           s += (k ? ";" : "") + f.extensions[k];
                                         return s;
                                       }()
                                    << "; sample has " << names.str() << ")");
    }
    const SampleMember& member = enc.members[static_cast<size_t>(p.member)];
    const uint8_t* data = enc.bytes() + member.data_begin;
    with_context(plan_, enc, &member, [&] {
      switch (f.decoder) {
        case FieldDecoder::kImage: {
          const ImageInfo info = probe_image(data, member.data_size, kNoWhere);
          p.height = info.height;
          p.width = info.width;
          break;
        }
        case FieldDecoder::kNpy:
          p.npy = parse_npy_header(data, member.data_size, kNoWhere);
          break;
        case FieldDecoder::kInt:
          p.label = parse_int_label(data, member.data_size, kNoWhere);
          break;
        case FieldDecoder::kRaw:
          break;
      }
    });
  }
}

void StreamEngine::record_skip(const std::string& message) {
  samples_skipped_.fetch_add(1);
  std::lock_guard<std::mutex> lock(skip_mutex_);
  if (skip_messages_.size() >= kMaxSkipMessages) skip_messages_.pop_front();
  skip_messages_.push_back(message);
}

std::vector<std::string> StreamEngine::take_skip_messages() {
  std::lock_guard<std::mutex> lock(skip_mutex_);
  std::vector<std::string> out(skip_messages_.begin(), skip_messages_.end());
  skip_messages_.clear();
  return out;
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
  buffer.reserve(chunk_size);
  auto push = [&](ShardJob::Chunk&& c) { return job.chunks.push(std::move(c)); };
  auto flush = [&]() -> bool {
    if (buffer.empty()) return true;
    ShardJob::Chunk c;
    c.samples.swap(buffer);
    buffer.reserve(chunk_size);
    return push(std::move(c));
  };
  try {
    uint64_t t0 = now_ns();
    SourceOptions options = plan_.source;
    options.cancel = &closed_;
    // Samples that wait in a shuffle buffer are copied: views would keep the
    // pages of every shard they came from mapped for as long as they wait.
    SampleReader reader(open_source(plan_.urls[job.shard], options), job.shard,
                        /*in_place=*/plan_.shuffle_capacity == 0);
    shards_opened_.fetch_add(1);
    auto payload_buffer = [&] {
      return reader.in_place() ? std::vector<uint8_t>() : payload_buffers_.take();
    };
    PlannedSample sample;
    sample.encoded.data = payload_buffer();
    while (!closed_.load(std::memory_order_relaxed) && next_sample(plan_, reader, sample.encoded)) {
      samples_read_.fetch_add(1, std::memory_order_relaxed);
      encoded_bytes_.fetch_add(sample.encoded.payload_bytes, std::memory_order_relaxed);
      try {
        probe(sample);
      } catch (const Error& e) {
        if (plan_.on_error == ErrorPolicy::kRaise) throw;
        record_skip(e.message());
        continue;
      }
      buffer.push_back(std::move(sample));
      sample = PlannedSample();
      sample.encoded.data = payload_buffer();
      if (buffer.size() >= chunk_size) {
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
    // Samples already parsed still reach the consumer. Under the skip policy
    // the rest of the shard is lost (a tar stream cannot be resynchronised)
    // and counted here; under raise the error travels to the consumer.
    if (!flush()) return;
    if (closed_.load()) return;  // a read the closing engine cancelled
    ShardJob::Chunk last;
    if (plan_.on_error == ErrorPolicy::kSkip) {
      record_skip(e.message());
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
      derive_seed({plan_.seed, static_cast<uint64_t>(plan_.epoch), static_cast<uint64_t>(stream),
                   0x5355464655ULL}));
  StreamItem item;
  auto flush = [&]() -> bool {
    if (item.samples.empty()) return true;
    StreamItem out;
    out.samples.swap(item.samples);
    item.samples.reserve(chunk);
    return queue.push(std::move(out));
  };
  auto emit = [&](PlannedSample&& s) -> bool {
    item.samples.push_back(std::move(s));
    return item.samples.size() < chunk || flush();
  };
  auto account_shuffle = [&] {
    shuffle_bytes_.store(shuffle.bytes());
    update_max(shuffle_peak_bytes_, shuffle.peak_bytes());
    update_max(shuffle_peak_samples_, shuffle.peak_items());
  };

  // The shard sequence: one pass over this stream's shards, again and again
  // when repeating, or random draws forever when resampling.
  Rng resample_rng(derive_seed({plan_.seed, static_cast<uint64_t>(plan_.epoch),
                                static_cast<uint64_t>(stream), 0x5245534dULL}));
  int64_t pass = 0;
  size_t position = 0;
  std::vector<uint32_t> order = shard_order(stream, 0);
  const bool endless = plan_.repeat || plan_.resampled;
  auto next_shard = [&](uint32_t* shard, int64_t* shard_pass) -> bool {
    if (order.empty()) return false;
    if (plan_.resampled) {
      *shard = order[resample_rng.below(order.size())];
      *shard_pass = 0;
      return true;
    }
    if (position == order.size()) {
      if (!endless) return false;
      order = shard_order(stream, ++pass);
      position = 0;
    }
    *shard = order[position++];
    *shard_pass = pass;
    return true;
  };

  std::deque<std::unique_ptr<ShardJob>> jobs;
  auto top_up = [&] {
    uint32_t shard;
    int64_t shard_pass;
    while (jobs.size() < static_cast<size_t>(std::max(1, plan_.parse_ahead)) &&
           next_shard(&shard, &shard_pass)) {
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
          bool ok = true;
          if (shuffle.enabled()) {
            PlannedSample out;
            const size_t bytes = sample.encoded.encoded_bytes();
            if (shuffle.push(std::move(sample), bytes, &out)) ok = emit(std::move(out));
            while (ok && shuffle.over_budget() && shuffle.pop(&out)) ok = emit(std::move(out));
          } else {
            ok = emit(std::move(sample));
          }
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

std::string StreamEngine::incompatibility(const PlannedSample& first,
                                          const PlannedSample& other) const {
  for (size_t i = 0; i < plan_.fields.size(); ++i) {
    const FieldPlan& f = plan_.fields[i];
    if (!f.stack || f.decoder == FieldDecoder::kRaw) continue;
    const ProbedField& a = first.fields[i];
    const ProbedField& b = other.fields[i];
    if (a.member < 0 || b.member < 0) continue;
    const DType da = row_dtype(f, a);
    const DType db = row_dtype(f, b);
    const std::vector<int64_t> sa = row_shape(f, a);
    const std::vector<int64_t> sb = row_shape(f, b);
    if (da != db || sa != sb) {
      const SampleMember& m = other.encoded.members[static_cast<size_t>(b.member)];
      std::ostringstream os;
      os << member_location(plan_, other.encoded, &m) << ": field '" << f.name << "' has "
         << dtype_name(db) << " shape " << shape_string(sb) << " but this batch holds "
         << dtype_name(da) << " shape " << shape_string(sa)
         << " (set an output size to resize images, or batch variable shapes as lists)";
      return os.str();
    }
  }
  return std::string();
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
      task.samples.reserve(batch_size);
      while (task.samples.size() < batch_size) {
        if (pending[s].empty()) {
          if (ended[s]) break;
          std::optional<StreamItem> item = stream_queues_[s]->pop();
          if (!item) return;  // closed
          if (item->error) {
            fail(item->error);
            end_decoding();
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
          const std::string why = incompatibility(task.samples.front(), sample);
          if (!why.empty()) {
            if (plan_.on_error == ErrorPolicy::kRaise) {
              fail(std::make_exception_ptr(Error(ErrorKind::kData, why, __FILE__, __LINE__)));
              end_decoding();
              return;
            }
            record_skip(why);
            continue;
          }
        }
        task.samples.push_back(std::move(sample));
      }
      const bool full = task.samples.size() == batch_size;
      if (full || (plan_.partial && !task.samples.empty())) {
        task.absolute = formed++;
        if (task.absolute >= plan_.skip_batches) {
          if (!results_.wait_for_slot(sequence)) return;
          task.sequence = sequence++;
          samples_batched_.fetch_add(task.samples.size());
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
  end_decoding();
}

// One batch being decoded: its pieces of rows are taken by any decode thread,
// the first to start allocates the batch, the last to finish delivers it.
struct StreamEngine::DecodeJob {
  BatchTask task;
  size_t piece_rows = 1;
  size_t num_pieces = 0;
  size_t next_piece = 0;              // guarded by decode_mutex_
  std::atomic<size_t> remaining{0};   // pieces not finished
  std::once_flag allocated;
  Batch batch;
  std::vector<uint8_t> failed;        // rows dropped under the skip policy
  // Under the raise policy the batch fails with the error of its first
  // failing row, whichever thread found it, so the message does not depend on
  // the thread count. Rows after it need not be decoded.
  std::mutex error_mutex;
  std::exception_ptr error;
  size_t error_row = SIZE_MAX;
  std::atomic<size_t> skip_from{SIZE_MAX};
};

bool StreamEngine::queue_for_decoding(BatchTask&& task) {
  auto job = std::make_shared<DecodeJob>();
  const size_t n = task.samples.size();
  // About 64 KiB of encoded input per piece: a few images, or a few hundred
  // tiny samples (a hand-off per tiny row would cost more than the row).
  size_t encoded = 0;
  for (const PlannedSample& s : task.samples) encoded += s.encoded.payload_bytes;
  const size_t per_row = std::max<size_t>(1, encoded / std::max<size_t>(1, n));
  job->piece_rows = std::clamp<size_t>((size_t{64} << 10) / per_row, 1, std::max<size_t>(1, n));
  job->num_pieces = (n + job->piece_rows - 1) / job->piece_rows;
  job->remaining.store(job->num_pieces);
  job->task = std::move(task);
  {
    std::lock_guard<std::mutex> lock(decode_mutex_);
    if (closed_.load()) return false;
    decode_queue_.push_back(std::move(job));
  }
  decode_cv_.notify_all();
  return true;
}

void StreamEngine::end_decoding() {
  {
    std::lock_guard<std::mutex> lock(decode_mutex_);
    decode_input_ended_ = true;
  }
  decode_cv_.notify_all();
}

void StreamEngine::run_decoder() {
  while (true) {
    std::shared_ptr<DecodeJob> job;
    size_t piece = 0;
    {
      std::unique_lock<std::mutex> lock(decode_mutex_);
      decode_cv_.wait(lock, [&] { return decode_input_ended_ || !decode_queue_.empty(); });
      if (decode_queue_.empty()) return;  // ended (or closed) and drained
      job = decode_queue_.front();
      piece = job->next_piece++;
      if (job->next_piece == job->num_pieces) decode_queue_.pop_front();
    }
    const uint64_t t0 = now_ns();
    try {
      std::call_once(job->allocated, [&] { allocate_batch(*job); });
      const size_t n = job->task.samples.size();
      const size_t begin = piece * job->piece_rows;
      decode_rows(*job, begin, std::min(n, begin + job->piece_rows));
    } catch (...) {
      // Allocation failed (out of memory): the batch is lost.
      std::lock_guard<std::mutex> lock(job->error_mutex);
      if (!job->error) {
        job->error = std::current_exception();
        job->error_row = 0;
      }
      job->skip_from.store(0);
    }
    decode_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
    if (job->remaining.fetch_sub(1) == 1) finish_batch(*job);
  }
}

void StreamEngine::allocate_batch(DecodeJob& job) {
  BatchTask& task = job.task;
  const size_t n = task.samples.size();
  Batch& batch = job.batch;
  batch.sequence = task.sequence;
  batch.size = static_cast<int64_t>(n);
  job.failed.assign(n, 0);
  if (plan_.collect_keys) {
    batch.keys.reserve(n);
    for (const PlannedSample& s : task.samples) batch.keys.push_back(s.encoded.key);
  }
  batch.source_index.reserve(n);
  for (const PlannedSample& s : task.samples) batch.source_index.push_back(s.encoded.source_index);
  batch.columns.resize(plan_.fields.size());
  for (size_t fi = 0; fi < plan_.fields.size(); ++fi) {
    const FieldPlan& f = plan_.fields[fi];
    Column& column = batch.columns[fi];
    bool any_absent = false;
    for (const PlannedSample& s : task.samples) any_absent |= s.fields[fi].member < 0;
    if (any_absent) {
      column.present.resize(n);
      for (size_t i = 0; i < n; ++i) column.present[i] = task.samples[i].fields[fi].member >= 0;
    }
    if (f.decoder == FieldDecoder::kRaw) {
      column.kind = ColumnKind::kBytes;
      column.raw.resize(n);
      continue;
    }
    column.kind = f.stack ? ColumnKind::kStacked : ColumnKind::kList;
    if (!f.stack) {
      column.items.resize(n);
      continue;
    }
    // The first present row fixes the stacked shape (the assembler checked the rest).
    const PlannedSample* shape_source = &task.samples.front();
    for (const PlannedSample& s : task.samples) {
      if (s.fields[fi].member >= 0) {
        shape_source = &s;
        break;
      }
    }
    const ProbedField& p0 = shape_source->fields[fi];
    std::vector<int64_t> shape = row_shape(f, p0);
    shape.insert(shape.begin(), static_cast<int64_t>(n));
    column.stacked = make_tensor(allocator_, row_dtype(f, p0), std::move(shape));
    if (any_absent) std::memset(column.stacked.data(), 0, column.stacked.nbytes());
  }
  if (plan_.keep_other_members) batch.other_members.resize(n);
}

void StreamEngine::decode_rows(DecodeJob& job, size_t begin, size_t end) {
  BatchTask& task = job.task;
  Batch& batch = job.batch;
  const size_t n = task.samples.size();
  // A failing row: under raise the batch fails with its first failing row
  // (whichever thread finds it) and later rows need no decoding; under skip
  // the row is dropped and counted.
  auto fail_row = [&](size_t i, std::exception_ptr error, const std::string& message) {
    if (plan_.on_error == ErrorPolicy::kRaise) {
      std::lock_guard<std::mutex> lock(job.error_mutex);
      if (i < job.error_row) {
        job.error = std::move(error);
        job.error_row = i;
        job.skip_from.store(i + 1);
      }
      return;
    }
    record_skip(message);
    job.failed[i] = 1;
  };
  size_t stop = begin;  // rows [begin, stop) were read
  for (size_t i = begin; i < end && i < job.skip_from.load(std::memory_order_relaxed); ++i) {
    const PlannedSample& s = task.samples[i];
    stop = i + 1;
    // Outside the try below: a failed allocation loses the batch (see
    // run_decoder), it does not make this sample bad.
    for (size_t fi = 0; fi < plan_.fields.size(); ++fi) {
      const FieldPlan& f = plan_.fields[fi];
      const ProbedField& p = s.fields[fi];
      Column& column = batch.columns[fi];
      if (p.member >= 0 && f.decoder != FieldDecoder::kRaw && column.kind == ColumnKind::kList) {
        column.items[i] = make_tensor(allocator_, row_dtype(f, p), row_shape(f, p));
      }
    }
    try {
      for (size_t fi = 0; fi < plan_.fields.size(); ++fi) {
        const FieldPlan& f = plan_.fields[fi];
        const ProbedField& p = s.fields[fi];
        if (p.member < 0) continue;
        const SampleMember& member = s.encoded.members[static_cast<size_t>(p.member)];
        const uint8_t* data = s.encoded.bytes() + member.data_begin;
        Column& column = batch.columns[fi];
        if (f.decoder == FieldDecoder::kRaw) {
          with_context(plan_, s.encoded, &member, [&] {
            column.raw[i].assign(reinterpret_cast<const char*>(data), member.data_size);
          });
          continue;
        }
        uint8_t* out = column.kind == ColumnKind::kStacked
                           ? column.stacked.data() + i * (column.stacked.nbytes() / n)
                           : column.items[i].data();
        with_context(plan_, s.encoded, &member, [&] {
          switch (f.decoder) {
            case FieldDecoder::kImage:
              decode_image_row(f, data, member.data_size, p.height, p.width,
                               derive_seed({plan_.seed, static_cast<uint64_t>(plan_.epoch),
                                            static_cast<uint64_t>(task.absolute), i, fi}),
                               out);
              break;
            case FieldDecoder::kNpy:
              copy_npy(p.npy, data, out);
              break;
            case FieldDecoder::kInt:
              std::memcpy(out, &p.label, sizeof(int64_t));
              break;
            case FieldDecoder::kRaw:
              break;
          }
        });
      }
      if (plan_.keep_other_members) {
        with_context(plan_, s.encoded, nullptr, [&] {
          for (size_t m = 0; m < s.encoded.members.size(); ++m) {
            bool claimed = false;
            for (const ProbedField& p : s.fields) claimed |= p.member == static_cast<int>(m);
            if (claimed) continue;
            const SampleMember& member = s.encoded.members[m];
            batch.other_members[i].emplace_back(
                member.extension,
                std::string(reinterpret_cast<const char*>(s.encoded.bytes() + member.data_begin),
                            member.data_size));
          }
        });
      }
    } catch (const Error& e) {
      fail_row(i, std::current_exception(), e.message());
      if (plan_.on_error == ErrorPolicy::kRaise) break;
    }
  }
  // Rows read in place are real only if their shard still held their bytes
  // after the reads: one fstat per shard for the whole piece.
  const MappedFile* checked = nullptr;
  for (size_t i = begin; i < stop; ++i) {
    const EncodedSample& s = task.samples[i].encoded;
    if (!s.mapping || job.failed[i]) continue;
    if (s.mapping.get() != checked) {
      s.mapping->check_size();
      checked = s.mapping.get();
    }
    if (s.lost()) {
      Error error = lost_error(plan_, s);
      const std::string message = error.message();
      fail_row(i, std::make_exception_ptr(std::move(error)), message);
    }
  }
}

void StreamEngine::finish_batch(DecodeJob& job) {
  if (job.error) {
    results_.put_error(job.task.sequence, job.error);
    return;
  }
  Batch& batch = job.batch;
  const std::vector<uint8_t>& failed = job.failed;
  const size_t n = job.task.samples.size();
  const size_t kept = n - static_cast<size_t>(std::count(failed.begin(), failed.end(), 1));
  if (kept != n) {
    // Rows whose body failed to decode (header was fine) are dropped; the
    // batch comes out shorter rather than holding a row of zeros.
    size_t w = 0;
    for (size_t r = 0; r < n; ++r) {
      if (failed[r]) continue;
      if (w != r) {
        for (Column& c : batch.columns) {
          if (c.kind == ColumnKind::kStacked) {
            const size_t rb = c.stacked.nbytes() / n;
            std::memmove(c.stacked.data() + w * rb, c.stacked.data() + r * rb, rb);
          } else if (c.kind == ColumnKind::kList) {
            c.items[w] = std::move(c.items[r]);
          } else {
            c.raw[w] = std::move(c.raw[r]);
          }
          if (!c.present.empty()) c.present[w] = c.present[r];
        }
        if (!batch.keys.empty()) batch.keys[w] = std::move(batch.keys[r]);
        batch.source_index[w] = batch.source_index[r];
        if (!batch.other_members.empty()) batch.other_members[w] = std::move(batch.other_members[r]);
      }
      ++w;
    }
    for (Column& c : batch.columns) {
      if (c.kind == ColumnKind::kStacked) c.stacked.shape[0] = static_cast<int64_t>(kept);
      c.items.resize(c.kind == ColumnKind::kList ? kept : 0);
      c.raw.resize(c.kind == ColumnKind::kBytes ? kept : 0);
      if (!c.present.empty()) c.present.resize(kept);
    }
    if (!batch.keys.empty()) batch.keys.resize(kept);
    batch.source_index.resize(kept);
    if (!batch.other_members.empty()) batch.other_members.resize(kept);
    batch.size = static_cast<int64_t>(kept);
  }
  // The encoded samples are no longer needed: their buffers go back to the
  // parse threads, and pages of their shards that held only them leave RSS.
  release_mapped_pages(job.task.samples);
  for (PlannedSample& s : job.task.samples) payload_buffers_.give(std::move(s.encoded.data));
  job.task.samples.clear();
  results_.put(job.task.sequence, std::move(batch));
}

// Samples read in place keep their shard mapped; once decoded, the pages
// that lie wholly inside them are dropped from RSS, so the resident part of
// a large shard stays about the batches in flight. Consecutive samples of a
// shard (the usual batch) make one range and one madvise.
void StreamEngine::release_mapped_pages(const std::vector<PlannedSample>& samples) {
  const MappedFile* file = nullptr;
  uint64_t begin = 0;
  uint64_t end = 0;
  auto flush = [&] {
    if (file != nullptr) file->release(begin, end);
  };
  for (const PlannedSample& s : samples) {
    const MappedFile* f = s.encoded.mapping.get();
    if (f == nullptr) continue;
    // The next sample's headers start at the 512-byte boundary after this one's end.
    if (f == file && s.encoded.offset >= end && s.encoded.offset <= end + 512) {
      end = s.encoded.end_offset;
      continue;
    }
    flush();
    file = f;
    begin = s.encoded.offset;
    end = s.encoded.end_offset;
  }
  flush();
}

StreamStats StreamEngine::stats() const {
  StreamStats s;
  s.shards_opened = shards_opened_.load();
  s.samples_read = samples_read_.load();
  s.samples_skipped = samples_skipped_.load();
  s.samples_batched = samples_batched_.load();
  s.batches = batches_.load();
  s.samples_yielded = samples_yielded_.load();
  s.encoded_bytes = encoded_bytes_.load();
  s.read_ns = read_ns_.load();
  s.decode_ns = decode_ns_.load();
  s.shuffle_bytes = shuffle_bytes_.load();
  s.shuffle_peak_bytes = shuffle_peak_bytes_.load();
  s.shuffle_peak_samples = shuffle_peak_samples_.load();
  s.queued_batches = results_.ready_count();
  s.memory = allocator_.stats();
  return s;
}

}  // namespace chute

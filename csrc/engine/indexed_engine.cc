#include "engine/indexed_engine.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "core/error.h"
#include "core/read_cancel.h"

namespace chute {

namespace {

// Piece size: about 128 KiB of output per piece, at least 2 rows. For
// 256-byte rows a batch of 256 is one piece (splitting it only adds
// hand-offs, and the prefetched batches keep the threads busy), while a
// batch of 32 rows of 63 KB becomes 16 pieces of 2 rows that both threads
// share, which matters when the consumer waits on one batch at a time.
int64_t default_piece_rows(size_t row_bytes) {
  const size_t target = size_t{128} << 10;
  const size_t rows = row_bytes == 0 ? 1024 : target / row_bytes;
  return static_cast<int64_t>(std::clamp<size_t>(rows, 2, 4096));
}

// The plan's decoding with the sample source's locations (sample mode).
SampleDecoding sample_decoding_of(const IndexedPlan& plan) {
  SampleDecoding d = plan.decoding;
  if (plan.samples != nullptr) {
    std::shared_ptr<const IndexedSampleSource> source = plan.samples;
    d.locate = [source](const EncodedSample& sample, const SampleMember* member) {
      return source->location(sample, member);
    };
  }
  return d;
}

}  // namespace

// One submitted batch: each piece range-checks its indices and has every
// source write its rows into place.
class IndexedEngine::GatherJob final : public PieceJob {
 public:
  GatherJob(IndexedEngine& engine, int64_t sequence, const int64_t* indices, size_t n)
      : PieceJob(sequence, n, static_cast<size_t>(engine.piece_rows_)),
        engine_(engine),
        indices_(indices, indices + n) {}

 private:
  void allocate() override {
    const auto n = static_cast<int64_t>(indices_.size());
    const std::vector<std::shared_ptr<RowSource>>& sources = engine_.plan_.sources;
    batch_.size = n;
    batch_.columns.resize(sources.size());
    for (size_t f = 0; f < sources.size(); ++f) {
      std::vector<int64_t> shape{n};
      const std::vector<int64_t>& rs = sources[f]->row_shape();
      shape.insert(shape.end(), rs.begin(), rs.end());
      Column& col = batch_.columns[f];
      col.kind = ColumnKind::kStacked;
      col.stacked = make_tensor(engine_.allocator_, sources[f]->dtype(), std::move(shape));
      col.stacked.descr = sources[f]->element_descr();
    }
  }

  void run(size_t begin, size_t end) override {
    const int64_t num_rows = engine_.num_rows_;
    const int64_t* idx = indices_.data() + begin;
    for (size_t i = 0; i < end - begin; ++i) {
      CHUTE_CHECK(idx[i] >= 0 && idx[i] < num_rows, kUsage,
                  "index " << idx[i] << " is out of range for a dataset of length " << num_rows
                           << " (position " << (begin + i) << " of batch " << sequence() << ")");
    }
    const std::vector<std::shared_ptr<RowSource>>& sources = engine_.plan_.sources;
    for (size_t f = 0; f < sources.size(); ++f) {
      const Tensor& t = batch_.columns[f].stacked;
      sources[f]->read_rows(idx, end - begin, t.data() + begin * sources[f]->row_bytes());
    }
    engine_.rows_read_.fetch_add(end - begin, std::memory_order_relaxed);
  }

  IndexedEngine& engine_;
  const std::vector<int64_t> indices_;
};

// One submitted batch of sample mode: the first worker to take a piece reads
// every sample of the batch (so neighbouring samples share reads) and probes
// their headers; then the batch is decoded as a stream batch is.
class IndexedEngine::SampleJob final : public StreamBatchJob {
 public:
  SampleJob(IndexedEngine& engine, int64_t sequence, const int64_t* indices, size_t n,
            int64_t epoch)
      : StreamBatchJob(engine.batch_context_, task_for(sequence, indices, n, epoch),
                       piece_rows_for(*engine.plan_.samples, indices, n)),
        engine_(engine) {}

 private:
  static BatchTask task_for(int64_t sequence, const int64_t* indices, size_t n, int64_t epoch) {
    BatchTask task;
    task.sequence = sequence;
    task.absolute = sequence;
    task.epoch = epoch;
    task.samples.resize(n);
    task.ids.assign(indices, indices + n);
    return task;
  }

  // From the sizes the index knows, before anything is read.
  static size_t piece_rows_for(const IndexedSampleSource& source, const int64_t* ids, size_t n) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] >= 0 && ids[i] < source.num_samples()) bytes += source.payload_bytes(ids[i]);
    }
    return decode_piece_rows(n, bytes);
  }

  void prepare() override {
    const IndexedSampleSource& source = *engine_.plan_.samples;
    BatchTask& t = task();
    const size_t n = t.samples.size();
    const int64_t num_rows = engine_.num_rows_;
    for (size_t i = 0; i < n; ++i) {
      CHUTE_CHECK(t.ids[i] >= 0 && t.ids[i] < num_rows, kUsage,
                  "index " << t.ids[i] << " is out of range for a dataset of length " << num_rows
                           << " (position " << i << " of batch " << sequence() << ")");
    }
    source.wait_readable(t.ids.data(), n, engine_.closing_);
    std::vector<EncodedSample> encoded(n);
    std::vector<std::optional<Error>> errors(n);
    source.read(t.ids.data(), n, encoded.data(), errors.data());
    engine_.rows_read_.fetch_add(n, std::memory_order_relaxed);
    const bool raise = context().decoding->on_error == ErrorPolicy::kRaise;
    for (size_t i = 0; i < n; ++i) {
      PlannedSample& sample = t.samples[i];
      sample.encoded = std::move(encoded[i]);
      std::optional<Error> error = std::move(errors[i]);
      if (error) {
        // A sample the source could not read (its bytes, or what they
        // should have been): a read failure of the sample, where it is.
        error = error->scoped(ErrorScope::kRead, source.location(sample.encoded, nullptr).place);
      } else {
        try {
          context().fields->probe(sample);
        } catch (const Error& e) {
          error = e;
        }
      }
      if (!error) continue;
      // Rows are read in order: the first error raised is the lowest row's.
      if (raise) throw *error;
      drop_row(i, *error);
    }
    unstack_uneven_fields();
  }

  // A stacked field whose rows differ in dtype or shape (images of several
  // sizes) becomes a list of tensors in this batch, as torch's collate would
  // have to refuse to stack them.
  void unstack_uneven_fields() {
    const std::vector<PlannedSample>& samples = task().samples;
    const std::vector<FieldPlan>& fields = context().decoding->fields;
    for (size_t fi = 0; fi < fields.size(); ++fi) {
      if (!fields[fi].stack || fields[fi].decoder == nullptr) continue;
      const ProbedField* first = nullptr;
      for (size_t i = 0; i < samples.size(); ++i) {
        if (dropped(i) || samples[i].fields[fi].member < 0) continue;
        const ProbedField& p = samples[i].fields[fi];
        if (first == nullptr) {
          first = &p;
        } else if (p.dtype != first->dtype || p.shape != first->shape) {
          unstack(fi);
          break;
        }
      }
    }
  }

  IndexedEngine& engine_;
};

IndexedEngine::IndexedEngine(IndexedPlan plan)
    : plan_(std::move(plan)),
      sample_decoding_(sample_decoding_of(plan_)),
      results_(std::max(1, plan_.max_in_flight)) {
  if (plan_.samples != nullptr) {
    CHUTE_CHECK(plan_.sources.empty(), kUsage,
                "an indexed plan reads either row sources or a sample source, not both");
    for (const FieldPlan& f : sample_decoding_.fields) {
      CHUTE_CHECK(!f.extensions.empty(), kUsage, "field '" << f.name << "' names no extension");
    }
    num_rows_ = plan_.samples->num_samples();
  }
  size_t row_bytes = 0;
  const std::vector<std::shared_ptr<RowSource>>& sources = plan_.sources;
  for (size_t i = 0; i < sources.size(); ++i) {
    CHUTE_CHECK(sources[i] != nullptr, kUsage, "field " << i << " is null");
    if (i == 0) num_rows_ = sources[i]->num_rows();
    CHUTE_CHECK(sources[i]->num_rows() == num_rows_, kUsage,
                "field '" << sources[i]->name() << "' has " << sources[i]->num_rows()
                          << " rows but field '" << sources[0]->name() << "' has " << num_rows_);
    row_bytes += sources[i]->row_bytes();
  }
  if (plan_.num_rows >= 0) {
    CHUTE_CHECK(plan_.samples == nullptr && (sources.empty() || num_rows_ == plan_.num_rows),
                kUsage,
                "the plan declares " << plan_.num_rows << " rows but its source has " << num_rows_);
    num_rows_ = plan_.num_rows;
  }
  CHUTE_CHECK(plan_.num_threads >= 0, kUsage,
              "num_threads must be 0 (batches made by next()) or more, not " << plan_.num_threads);
  // Without threads a batch is one piece: its rows' reads share one SIGBUS
  // guard and one size check per file.
  const int64_t whole = std::numeric_limits<int32_t>::max();
  piece_rows_ = plan_.piece_rows > 0         ? plan_.piece_rows
                : plan_.num_threads == 0 ? whole
                                         : default_piece_rows(row_bytes);
  allocator_.set_pin_hooks(plan_.pin);
  for (int i = 0; i < plan_.num_threads; ++i) {
    threads_.spawn("chute-read", [this] {
      const ReadCancelScope reads_stop_with_the_engine(&cancel_reads_);
      gathering_.work();
    });
  }
}

IndexedEngine::~IndexedEngine() { close(); }

void IndexedEngine::close() {
  closing_.store(true);  // ends a worker's wait for its samples' bytes
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  cancel_reads_.store(true);
  gathering_.close();
  results_.close();
  threads_.join();
}

int64_t IndexedEngine::submit(const int64_t* indices, size_t n, int64_t epoch) {
  std::lock_guard<std::mutex> lock(mutex_);
  CHUTE_CHECK(!closed_, kUsage, "submit() on a closed engine");
  const int64_t sequence = next_sequence_++;
  rows_submitted_.fetch_add(n, std::memory_order_relaxed);
  if (plan_.samples != nullptr) {
    gathering_.push(std::make_shared<SampleJob>(*this, sequence, indices, n, epoch));
  } else {
    gathering_.push(std::make_shared<GatherJob>(*this, sequence, indices, n));
  }
  return sequence;
}

int64_t IndexedEngine::outstanding() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_sequence_ - results_.consumed();
}

OrderedResults::Status IndexedEngine::next(Batch* out, double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    CHUTE_CHECK(!closed_, kUsage, "next() on a closed engine");
    CHUTE_CHECK(next_sequence_ > results_.consumed(), kUsage,
                "next() with no batch submitted and not yet returned");
  }
  // Batches are queued in sequence order, and only a batch without rows is
  // delivered before it is run: the next one is ready or the oldest queued.
  if (plan_.num_threads == 0 && !results_.next_ready()) gathering_.run_oldest();
  const OrderedResults::Status status = results_.next(out, timeout_s);
  switch (status) {
    case OrderedResults::Status::kBatch:
      delivered_.count(*out);
      break;
    case OrderedResults::Status::kTimeout:
      break;
    case OrderedResults::Status::kClosed:
    case OrderedResults::Status::kEnd:
      CHUTE_CHECK(false, kUsage, "next() on a closed engine");
  }
  return status;
}

void IndexedEngine::gather(const int64_t* indices, size_t n, Batch* out) {
  CHUTE_CHECK(plan_.num_threads == 0, kUsage, "gather() is for an engine without threads");
  CHUTE_CHECK(outstanding() == 0, kUsage, "gather() with batches submitted and not yet returned");
  submit(indices, n);
  next(out, 0.0);
}

EngineStats IndexedEngine::stats() const {
  EngineStats s;
  delivered_.fill(s);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s.batches_submitted = static_cast<uint64_t>(next_sequence_);
  }
  s.queued_batches = results_.ready_count();
  s.samples_read = rows_read_.load(std::memory_order_relaxed);
  s.samples_skipped = skips_.count();
  s.samples_batched = rows_submitted_.load(std::memory_order_relaxed);
  fill_worker_figures(gathering_, results_, s);
  s.memory = allocator_.stats();
  return s;
}

void IndexedEngine::set_active_threads(int threads, int64_t in_flight) {
  gathering_.set_active_limit(threads);
  results_.set_max_in_flight(in_flight);
}

}  // namespace chute

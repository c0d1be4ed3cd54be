#include "pipeline/indexed_engine.h"

#include <algorithm>

#include "core/error.h"

namespace chute {

namespace {

// Piece size: about 128 KiB of output per piece, at least 2 rows. Measured on
// 2 cores: for 256-byte rows a batch of 256 is one piece (splitting it only
// adds hand-offs, and the prefetched batches keep both cores busy), while a
// batch of 32 rows of 63 KB becomes 16 pieces of 2 rows that both threads
// share, which matters when the consumer waits on one batch at a time.
int64_t default_piece_rows(size_t row_bytes) {
  const size_t target = size_t{128} << 10;
  const size_t rows = row_bytes == 0 ? 1024 : target / row_bytes;
  return static_cast<int64_t>(std::clamp<size_t>(rows, 2, 4096));
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

IndexedEngine::IndexedEngine(IndexedPlan plan)
    : plan_(std::move(plan)), results_(std::max(1, plan_.max_in_flight)) {
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
  piece_rows_ = plan_.piece_rows > 0 ? plan_.piece_rows : default_piece_rows(row_bytes);
  allocator_.set_pin_hooks(plan_.pin);
  const int n = std::max(1, plan_.num_threads);
  for (int i = 0; i < n; ++i) threads_.spawn("chute-read", [this] { gathering_.work(); });
}

IndexedEngine::~IndexedEngine() { close(); }

void IndexedEngine::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  gathering_.close();
  results_.close();
  threads_.join();
}

int64_t IndexedEngine::submit(const int64_t* indices, size_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  CHUTE_CHECK(!closed_, kUsage, "submit() on a closed engine");
  const int64_t sequence = next_sequence_++;
  rows_submitted_.fetch_add(n, std::memory_order_relaxed);
  gathering_.push(std::make_shared<GatherJob>(*this, sequence, indices, n));
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

EngineStats IndexedEngine::stats() const {
  EngineStats s;
  delivered_.fill(s);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s.batches_submitted = static_cast<uint64_t>(next_sequence_);
  }
  s.queued_batches = results_.ready_count();
  s.samples_read = rows_read_.load(std::memory_order_relaxed);
  s.samples_batched = rows_submitted_.load(std::memory_order_relaxed);
  s.decode_ns = gathering_.busy_ns();
  s.memory = allocator_.stats();
  return s;
}

}  // namespace chute

#include "pipeline/indexed_engine.h"

#include <algorithm>
#include <exception>
#include <mutex>

#include "core/error.h"

namespace chute {

struct IndexedEngine::Task {
  int64_t sequence = 0;
  std::vector<int64_t> indices;
  int64_t num_pieces = 0;
  int64_t next_piece = 0;               // guarded by the engine mutex
  std::atomic<int64_t> remaining{0};    // pieces not finished
  std::once_flag allocated;
  Batch batch;
  std::mutex error_mutex;
  std::exception_ptr error;
};

namespace {

// Piece size: about 128 KiB of output per piece, at least 8 rows. Measured on
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

IndexedEngine::IndexedEngine(std::vector<std::shared_ptr<RowSource>> fields, int num_threads,
                             int max_in_flight, int64_t piece_rows)
    : fields_(std::move(fields)), results_(max_in_flight < 1 ? 1 : max_in_flight) {
  size_t row_bytes = 0;
  for (size_t i = 0; i < fields_.size(); ++i) {
    CHUTE_CHECK(fields_[i] != nullptr, kUsage, "field " << i << " is null");
    if (i == 0) num_rows_ = fields_[i]->num_rows();
    CHUTE_CHECK(fields_[i]->num_rows() == num_rows_, kUsage,
                "field '" << fields_[i]->name() << "' has " << fields_[i]->num_rows()
                          << " rows but field '" << fields_[0]->name() << "' has " << num_rows_);
    row_bytes += fields_[i]->row_bytes();
  }
  piece_rows_ = piece_rows > 0 ? piece_rows : default_piece_rows(row_bytes);
  const int n = std::max(1, num_threads);
  for (int i = 0; i < n; ++i) threads_.spawn("chute-read", [this] { worker(); });
}

IndexedEngine::~IndexedEngine() { close(); }

void IndexedEngine::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    queue_.clear();
  }
  work_cv_.notify_all();
  results_.close();
  threads_.join();
}

int64_t IndexedEngine::submit(const int64_t* indices, size_t n) {
  auto task = std::make_shared<Task>();
  task->indices.assign(indices, indices + n);
  task->num_pieces = (static_cast<int64_t>(n) + piece_rows_ - 1) / piece_rows_;
  task->remaining.store(task->num_pieces);
  std::lock_guard<std::mutex> lock(mutex_);
  CHUTE_CHECK(!closed_, kUsage, "submit() on a closed engine");
  task->sequence = next_sequence_++;
  if (task->num_pieces == 0) {  // an empty batch: nothing for a worker to do
    allocate(*task);
    results_.put(task->sequence, std::move(task->batch));
    return task->sequence;
  }
  queue_.push_back(task);
  work_cv_.notify_all();
  return task->sequence;
}

int64_t IndexedEngine::outstanding() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_sequence_ - results_.consumed();
}

bool IndexedEngine::next(Batch* out, double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    CHUTE_CHECK(!closed_, kUsage, "next() on a closed engine");
    CHUTE_CHECK(next_sequence_ > results_.consumed(), kUsage,
                "next() with no batch submitted and not yet returned");
  }
  const OrderedResults::Status status = results_.next(out, timeout_s);
  switch (status) {
    case OrderedResults::Status::kBatch:
      break;
    case OrderedResults::Status::kTimeout:
      return false;
    case OrderedResults::Status::kClosed:
    case OrderedResults::Status::kEnd:
      CHUTE_CHECK(false, kUsage, "next() on a closed engine");
  }
  delivered_batches_.fetch_add(1, std::memory_order_relaxed);
  delivered_rows_.fetch_add(static_cast<uint64_t>(out->size), std::memory_order_relaxed);
  uint64_t bytes = 0;
  for (const Column& c : out->columns) bytes += c.stacked.nbytes();
  delivered_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

void IndexedEngine::allocate(Task& task) {
  const auto n = static_cast<int64_t>(task.indices.size());
  task.batch.sequence = task.sequence;
  task.batch.size = n;
  task.batch.columns.resize(fields_.size());
  for (size_t f = 0; f < fields_.size(); ++f) {
    std::vector<int64_t> shape{n};
    const std::vector<int64_t>& rs = fields_[f]->row_shape();
    shape.insert(shape.end(), rs.begin(), rs.end());
    Column& col = task.batch.columns[f];
    col.kind = ColumnKind::kStacked;
    col.stacked = make_tensor(allocator_, fields_[f]->dtype(), std::move(shape));
  }
}

void IndexedEngine::worker() {
  while (true) {
    std::shared_ptr<Task> task;
    int64_t piece = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
      if (closed_) return;
      task = queue_.front();
      piece = task->next_piece++;
      if (task->next_piece == task->num_pieces) queue_.pop_front();
    }
    // Do not run ahead of the consumer by more than max_in_flight batches:
    // that bounds the batch memory alive at once.
    if (!results_.wait_for_slot(task->sequence)) return;
    run_piece(*task, piece);
    if (task->remaining.fetch_sub(1) == 1) {
      if (task->error) {
        results_.put_error(task->sequence, task->error);
      } else {
        results_.put(task->sequence, std::move(task->batch));
      }
    }
  }
}

void IndexedEngine::run_piece(Task& task, int64_t piece) {
  try {
    std::call_once(task.allocated, [&] { allocate(task); });
    {
      // Once one piece failed the batch is lost; skip the work.
      std::lock_guard<std::mutex> lock(task.error_mutex);
      if (task.error) return;
    }
    const size_t n = task.indices.size();
    const size_t begin = static_cast<size_t>(piece * piece_rows_);
    const size_t end = std::min(n, begin + static_cast<size_t>(piece_rows_));
    const int64_t* idx = task.indices.data() + begin;
    for (size_t i = 0; i < end - begin; ++i) {
      CHUTE_CHECK(idx[i] >= 0 && idx[i] < num_rows_, kUsage,
                  "index " << idx[i] << " is out of range for a dataset of length " << num_rows_
                           << " (position " << (begin + i) << " of batch " << task.sequence << ")");
    }
    for (size_t f = 0; f < fields_.size(); ++f) {
      const Tensor& t = task.batch.columns[f].stacked;
      const size_t rb = fields_[f]->row_bytes();
      fields_[f]->read_rows(idx, end - begin, t.data() + begin * rb);
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(task.error_mutex);
    if (!task.error) task.error = std::current_exception();
  }
}

IndexedEngineStats IndexedEngine::stats() const {
  IndexedEngineStats s;
  s.batches = delivered_batches_.load();
  s.rows = delivered_rows_.load();
  s.bytes = delivered_bytes_.load();
  for (const auto& f : fields_) s.source_bytes_read += f->bytes_read();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s.submitted = next_sequence_;
  }
  s.allocator = allocator_.stats();
  return s;
}

}  // namespace chute

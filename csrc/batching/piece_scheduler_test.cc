#include "batching/piece_scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <ostream>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "memory/batch_allocator.h"

namespace chute {
namespace {

using namespace std::chrono_literals;
using Status = OrderedResults::Status;

// Hang guard for waits that must end: far longer than any correct run needs.
constexpr auto kHangGuard = 30s;
// How long a test watches for something that must NOT happen yet. A correct
// scheduler never lets it happen, so this cannot fail spuriously; a wrong one
// is caught unless its worker is slower than this to get there.
constexpr auto kStillBlocked = 50ms;

std::exception_ptr data_error(const std::string& message) {
  try {
    CHUTE_CHECK(false, kData, message);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// A one-way gate: waits end once it is opened.
class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // False when the hang guard ran out first.
  bool wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, kHangGuard, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Which pieces started, in the order they started: (batch sequence, first row).
class StartLog {
 public:
  void record(int64_t sequence, size_t begin) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      starts_.emplace_back(sequence, begin);
    }
    cv_.notify_all();
  }
  // Waits until at least n pieces started; false after `limit`.
  template <typename Duration>
  bool wait_for(size_t n, Duration limit) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, limit, [&] { return starts_.size() >= n; });
  }
  std::vector<std::pair<int64_t, size_t>> starts() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return starts_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::pair<int64_t, size_t>> starts_;
};

// A batch of int64 rows whose row r holds sequence * 1000 + r. It counts what
// the scheduler asks of it, and lets a test hold a piece (on_piece) or fail
// rows (row_error) the way an engine's job does.
class TestJob final : public PieceJob {
 public:
  TestJob(int64_t sequence, size_t rows, size_t piece_rows, BatchAllocator& allocator,
          StartLog* log = nullptr)
      : PieceJob(sequence, rows, piece_rows),
        allocator_(allocator),
        log_(log),
        runs_(new std::atomic<int>[rows == 0 ? 1 : rows]) {
    for (size_t r = 0; r < rows; ++r) runs_[r] = 0;
  }

  // At the start of each piece, on its worker (may block or throw).
  std::function<void(size_t begin, size_t end)> on_piece;
  // In allocate(), on the allocating worker (may block).
  std::function<void()> on_allocate;
  // A row's error, or null when it succeeds; the job reports it with fail().
  std::function<std::exception_ptr(size_t row)> row_error;
  bool reverse_rows = false;           // make a piece's rows last to first
  std::exception_ptr allocate_error;   // allocate() throws it

  int allocations() const { return allocations_.load(); }
  int finishes() const { return finishes_.load(); }
  int runs(size_t row) const { return runs_[row].load(); }
  int pieces_before_allocation() const { return pieces_before_allocation_.load(); }
  size_t rows_done_at_finish() const { return rows_done_at_finish_; }

 private:
  void allocate() override {
    allocations_.fetch_add(1);
    if (on_allocate) on_allocate();
    if (allocate_error) std::rethrow_exception(allocate_error);
    batch_.size = static_cast<int64_t>(rows());
    Column column;
    column.stacked = make_tensor(allocator_, DType::kI64, {static_cast<int64_t>(rows())});
    batch_.columns.push_back(std::move(column));
    allocated_.store(true);
  }

  void run(size_t begin, size_t end) override {
    if (log_ != nullptr) log_->record(sequence(), begin);
    if (!allocated_.load()) pieces_before_allocation_.fetch_add(1);
    if (on_piece) on_piece(begin, end);
    auto* values = reinterpret_cast<int64_t*>(batch_.columns[0].stacked.data());
    for (size_t i = begin; i < end; ++i) {
      const size_t r = reverse_rows ? end - 1 - (i - begin) : i;
      runs_[r].fetch_add(1);
      values[r] = sequence() * 1000 + static_cast<int64_t>(r);
      if (row_error) {
        if (std::exception_ptr e = row_error(r)) fail(r, e);
      }
    }
    rows_done_.fetch_add(end - begin);
  }

  void finish() override {
    finishes_.fetch_add(1);
    rows_done_at_finish_ = rows_done_.load();
  }

  BatchAllocator& allocator_;
  StartLog* log_;
  std::unique_ptr<std::atomic<int>[]> runs_;
  std::atomic<bool> allocated_{false};
  std::atomic<int> allocations_{0};
  std::atomic<int> finishes_{0};
  std::atomic<int> pieces_before_allocation_{0};
  std::atomic<size_t> rows_done_{0};
  size_t rows_done_at_finish_ = 0;  // written by the delivering thread, read after next()
};

// Worker threads running PieceScheduler::work(). If a test goes wrong and a
// worker would never return, join() closes the scheduler and the results so
// the test fails instead of hanging.
class Workers {
 public:
  Workers(PieceScheduler& scheduler, OrderedResults& results, int n)
      : scheduler_(scheduler), results_(results) {
    for (int i = 0; i < n; ++i) {
      done_.push_back(std::async(std::launch::async, [this] { scheduler_.work(); }));
    }
  }
  ~Workers() { join(); }

  // True when every worker returned within the hang guard.
  bool join() {
    bool all = true;
    const auto deadline = std::chrono::steady_clock::now() + kHangGuard;
    for (auto& f : done_) {
      if (f.valid() && f.wait_until(deadline) != std::future_status::ready) all = false;
    }
    if (!all) {
      scheduler_.close();
      results_.close();
    }
    for (auto& f : done_) {
      if (f.valid()) f.get();
    }
    return all;
  }

 private:
  PieceScheduler& scheduler_;
  OrderedResults& results_;
  std::vector<std::future<void>> done_;
};

// The consumer's next batch, waiting at most the hang guard.
Status next(OrderedResults& results, Batch* out) {
  return results.next(out, std::chrono::duration<double>(kHangGuard).count());
}

// The error that next() rethrows for a failed batch.
std::optional<Error> next_error(OrderedResults& results) {
  Batch out;
  return test::error_from([&] { next(results, &out); });
}

void expect_rows(const Batch& batch, int64_t sequence, size_t rows) {
  ASSERT_EQ(batch.sequence, sequence);
  ASSERT_EQ(batch.size, static_cast<int64_t>(rows));
  ASSERT_EQ(batch.columns.size(), 1u);
  const auto* values = reinterpret_cast<const int64_t*>(batch.columns[0].stacked.data());
  for (size_t r = 0; r < rows; ++r) EXPECT_EQ(values[r], sequence * 1000 + static_cast<int64_t>(r));
}

TEST(PieceScheduler, OneWorkerTakesThePiecesOfTheOldestBatchFirst) {
  BatchAllocator allocator;
  OrderedResults results(8);
  PieceScheduler scheduler(results);
  StartLog log;
  // 5 rows in pieces of 2: pieces start at rows 0, 2 and 4.
  for (int64_t s = 0; s < 3; ++s) {
    ASSERT_TRUE(scheduler.push(std::make_shared<TestJob>(s, 5, 2, allocator, &log)));
  }
  scheduler.end();
  results.finish(3);
  scheduler.work();  // returns once every piece is taken
  const std::vector<std::pair<int64_t, size_t>> expected = {
      {0, 0}, {0, 2}, {0, 4}, {1, 0}, {1, 2}, {1, 4}, {2, 0}, {2, 2}, {2, 4}};
  EXPECT_EQ(log.starts(), expected);
  for (int64_t s = 0; s < 3; ++s) {
    Batch out;
    ASSERT_EQ(next(results, &out), Status::kBatch);
    expect_rows(out, s, 5);
  }
  Batch out;
  EXPECT_EQ(next(results, &out), Status::kEnd);
}

TEST(PieceScheduler, AFreeWorkerTakesAnUntakenPieceOfAnEarlierBatchFirst) {
  BatchAllocator allocator;
  OrderedResults results(8);
  PieceScheduler scheduler(results);
  StartLog log;
  // Batch 0: three one-row pieces; its pieces 0 and 1 wait for their gate.
  // Batch 1: one piece, queued behind it once both workers hold a piece.
  Gate gates[2];
  auto first = std::make_shared<TestJob>(0, 3, 1, allocator, &log);
  first->on_piece = [&](size_t begin, size_t) {
    if (begin < 2) {
      EXPECT_TRUE(gates[begin].wait());
    }
  };
  ASSERT_TRUE(scheduler.push(first));
  results.finish(2);
  Workers workers(scheduler, results, 2);
  ASSERT_TRUE(log.wait_for(2, kHangGuard));
  // Queued only now: a worker that came while batch 0 was being allocated
  // would have taken it rather than wait.
  ASSERT_TRUE(scheduler.push(std::make_shared<TestJob>(1, 1, 1, allocator, &log)));
  scheduler.end();
  // Both workers hold a piece of batch 0; when one is let go it must take
  // batch 0's last piece, not batch 1's.
  gates[0].open();
  ASSERT_TRUE(log.wait_for(3, kHangGuard));
  std::vector<std::pair<int64_t, size_t>> starts = log.starts();
  const std::set<std::pair<int64_t, size_t>> held(starts.begin(), starts.begin() + 2);
  EXPECT_EQ(held, (std::set<std::pair<int64_t, size_t>>{{0, 0}, {0, 1}}));
  EXPECT_EQ(starts[2], (std::pair<int64_t, size_t>{0, 2}));
  gates[1].open();
  ASSERT_TRUE(workers.join());
  starts = log.starts();
  ASSERT_EQ(starts.size(), 4u);
  EXPECT_EQ(starts[3], (std::pair<int64_t, size_t>{1, 0}));
  for (int64_t s = 0; s < 2; ++s) {
    Batch out;
    ASSERT_EQ(next(results, &out), Status::kBatch);
    expect_rows(out, s, s == 0 ? 3 : 1);
  }
}

class PieceSchedulerWorkers : public ::testing::TestWithParam<int> {};

TEST_P(PieceSchedulerWorkers, EveryRowRunsOnceAndBatchesComeOutInOrder) {
  const int num_workers = GetParam();
  BatchAllocator allocator;
  OrderedResults results(3);
  PieceScheduler scheduler(results);
  constexpr int64_t kBatches = 40;
  std::vector<std::shared_ptr<TestJob>> jobs;
  for (int64_t s = 0; s < kBatches; ++s) {
    // Sizes 1..13 in pieces of 1..4 rows: many batches that split unevenly.
    jobs.push_back(std::make_shared<TestJob>(s, static_cast<size_t>(1 + s % 13),
                                             static_cast<size_t>(1 + s % 4), allocator));
  }
  Workers workers(scheduler, results, num_workers);
  for (const auto& job : jobs) ASSERT_TRUE(scheduler.push(job));
  scheduler.end();
  results.finish(kBatches);
  for (int64_t s = 0; s < kBatches; ++s) {
    Batch out;
    ASSERT_EQ(next(results, &out), Status::kBatch);
    expect_rows(out, s, jobs[static_cast<size_t>(s)]->rows());
  }
  Batch out;
  EXPECT_EQ(next(results, &out), Status::kEnd);
  ASSERT_TRUE(workers.join());
  for (const auto& job : jobs) {
    EXPECT_EQ(job->allocations(), 1) << "batch " << job->sequence();
    EXPECT_EQ(job->finishes(), 1) << "batch " << job->sequence();
    EXPECT_EQ(job->pieces_before_allocation(), 0) << "batch " << job->sequence();
    EXPECT_EQ(job->rows_done_at_finish(), job->rows()) << "batch " << job->sequence();
    for (size_t r = 0; r < job->rows(); ++r) {
      EXPECT_EQ(job->runs(r), 1) << "batch " << job->sequence() << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, PieceSchedulerWorkers, ::testing::Values(1, 2, 4, 8));

TEST(PieceScheduler, TheFirstTakerAllocatesAndTheLastFinisherDelivers) {
  BatchAllocator allocator;
  OrderedResults results(4);
  PieceScheduler scheduler(results);
  auto job = std::make_shared<TestJob>(0, 7, 2, allocator);
  ASSERT_TRUE(scheduler.push(job));
  EXPECT_EQ(job->allocations(), 0);  // pushing allocates nothing: a worker does
  scheduler.end();
  scheduler.work();
  EXPECT_EQ(job->allocations(), 1);
  EXPECT_EQ(job->pieces_before_allocation(), 0);
  EXPECT_EQ(job->finishes(), 1);
  EXPECT_EQ(job->rows_done_at_finish(), 7u);  // finish() came after the last piece
  EXPECT_EQ(results.ready_count(), 1);
  Batch out;
  ASSERT_EQ(next(results, &out), Status::kBatch);
  expect_rows(out, 0, 7);
}

TEST(PieceScheduler, ABatchIsDeliveredOnlyWhenItsLastPieceIsDone) {
  BatchAllocator allocator;
  OrderedResults results(4);
  PieceScheduler scheduler(results);
  // Two pieces on two workers; the piece of rows [0, 2) waits until the
  // other piece ran, so rows [2, 4) finish first.
  StartLog log;
  Gate first_piece;
  auto job = std::make_shared<TestJob>(0, 4, 2, allocator, &log);
  job->on_piece = [&](size_t begin, size_t) {
    if (begin == 0) {
      EXPECT_TRUE(first_piece.wait());
    }
  };
  ASSERT_TRUE(scheduler.push(job));
  scheduler.end();
  results.finish(1);
  Workers workers(scheduler, results, 2);
  ASSERT_TRUE(log.wait_for(2, kHangGuard));
  Batch out;
  EXPECT_EQ(results.next(&out, std::chrono::duration<double>(kStillBlocked).count()),
            Status::kTimeout)
      << "delivered while a piece was still running";
  first_piece.open();
  ASSERT_EQ(next(results, &out), Status::kBatch);
  expect_rows(out, 0, 4);
  ASSERT_TRUE(workers.join());
  EXPECT_EQ(job->finishes(), 1);
  EXPECT_EQ(job->rows_done_at_finish(), 4u);
}

// Rows 5 and 6 of 8 fail, row 6 first in time (row 5 waits for it): the batch
// fails with row 5's error whatever the workers and pieces.
struct LowestRowCase {
  int workers;
  size_t piece_rows;
};

void PrintTo(const LowestRowCase& c, std::ostream* os) {
  *os << c.workers << " workers, pieces of " << c.piece_rows << " rows";
}

class PieceSchedulerLowestRow : public ::testing::TestWithParam<LowestRowCase> {};

TEST_P(PieceSchedulerLowestRow, TheBatchFailsWithItsLowestFailingRow) {
  const LowestRowCase c = GetParam();
  BatchAllocator allocator;
  OrderedResults results(4);
  PieceScheduler scheduler(results);
  Gate row6_failed;
  std::vector<int> failed_in_order;
  std::mutex order_mutex;
  auto job = std::make_shared<TestJob>(0, 8, c.piece_rows, allocator);
  // Rows of a piece run last to first, so row 6 fails before row 5 even when
  // one piece holds both.
  job->reverse_rows = true;
  job->row_error = [&](size_t row) -> std::exception_ptr {
    if (row != 5 && row != 6) return nullptr;
    if (row == 5) {
      EXPECT_TRUE(row6_failed.wait()) << "row 6 never failed";
    }
    {
      std::lock_guard<std::mutex> lock(order_mutex);
      failed_in_order.push_back(static_cast<int>(row));
    }
    if (row == 6) row6_failed.open();
    return data_error("row " + std::to_string(row) + " is bad");
  };
  // A batch behind it is unaffected.
  auto after = std::make_shared<TestJob>(1, 3, 1, allocator);
  ASSERT_TRUE(scheduler.push(job));
  ASSERT_TRUE(scheduler.push(after));
  scheduler.end();
  results.finish(2);
  Workers workers(scheduler, results, c.workers);
  const std::optional<Error> e = next_error(results);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(), "row 5 is bad");
  Batch out;
  ASSERT_EQ(next(results, &out), Status::kBatch);
  expect_rows(out, 1, 3);
  ASSERT_TRUE(workers.join());
  EXPECT_EQ(failed_in_order, (std::vector<int>{6, 5}));
  EXPECT_EQ(job->finishes(), 0);  // a failed batch is not finished
  for (size_t r = 0; r < 5; ++r) EXPECT_EQ(job->runs(r), 1) << "row " << r;
}

INSTANTIATE_TEST_SUITE_P(Layouts, PieceSchedulerLowestRow,
                         ::testing::Values(LowestRowCase{1, 8}, LowestRowCase{1, 4},
                                           LowestRowCase{2, 1}, LowestRowCase{2, 2},
                                           LowestRowCase{4, 1}, LowestRowCase{4, 3}),
                         [](const ::testing::TestParamInfo<LowestRowCase>& info) {
                           return std::to_string(info.param.workers) + "workers_" +
                                  std::to_string(info.param.piece_rows) + "rows";
                         });

TEST(PieceScheduler, RowsPastAFailedRowAreNotRun) {
  BatchAllocator allocator;
  OrderedResults results(4);
  PieceScheduler scheduler(results);
  auto job = std::make_shared<TestJob>(0, 10, 1, allocator);
  job->row_error = [](size_t row) { return row == 3 ? data_error("row 3") : nullptr; };
  ASSERT_TRUE(scheduler.push(job));
  scheduler.end();
  results.finish(1);
  scheduler.work();
  const std::optional<Error> e = next_error(results);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "row 3");
  for (size_t r = 0; r < 10; ++r) EXPECT_EQ(job->runs(r), r <= 3 ? 1 : 0) << "row " << r;
}

TEST(PieceScheduler, APieceThatThrowsFailsTheBatchAsItsFirstRow) {
  BatchAllocator allocator;
  OrderedResults results(4);
  PieceScheduler scheduler(results);
  // Pieces [0, 3), [3, 6), [6, 9): the middle one throws; the last one still
  // fails at row 7, later than row 3.
  auto job = std::make_shared<TestJob>(0, 9, 3, allocator);
  job->on_piece = [](size_t begin, size_t) {
    CHUTE_CHECK(begin != 3, kIo, "piece at row " << begin << " cannot be read");
  };
  job->row_error = [](size_t row) { return row == 7 ? data_error("row 7") : nullptr; };
  ASSERT_TRUE(scheduler.push(job));
  scheduler.end();
  results.finish(1);
  scheduler.work();
  const std::optional<Error> e = next_error(results);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kIo);  // the error keeps its kind
  EXPECT_EQ(e->message(), "piece at row 3 cannot be read");
  // Row 3 failed: the piece after it starts past the stop row and is not run.
  for (size_t r = 0; r < 9; ++r) EXPECT_EQ(job->runs(r), r < 3 ? 1 : 0) << "row " << r;
}

TEST(PieceScheduler, AFailedAllocationLosesTheBatch) {
  for (int num_workers : {1, 3}) {
    SCOPED_TRACE(num_workers);
    BatchAllocator allocator;
    OrderedResults results(4);
    PieceScheduler scheduler(results);
    // Six pieces: the pieces after the first must neither allocate again
    // nor run rows of the lost batch.
    auto lost = std::make_shared<TestJob>(0, 6, 1, allocator);
    try {
      CHUTE_CHECK(false, kIo, "cannot allocate 6 rows");
    } catch (...) {
      lost->allocate_error = std::current_exception();
    }
    auto after = std::make_shared<TestJob>(1, 2, 1, allocator);
    ASSERT_TRUE(scheduler.push(lost));
    ASSERT_TRUE(scheduler.push(after));
    scheduler.end();
    results.finish(2);
    Workers workers(scheduler, results, num_workers);
    const std::optional<Error> e = next_error(results);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind(), ErrorKind::kIo);
    EXPECT_EQ(e->message(), "cannot allocate 6 rows");
    Batch out;
    ASSERT_EQ(next(results, &out), Status::kBatch);
    expect_rows(out, 1, 2);
    ASSERT_TRUE(workers.join());
    EXPECT_EQ(lost->allocations(), 1);
    EXPECT_EQ(lost->finishes(), 0);
    for (size_t r = 0; r < 6; ++r) EXPECT_EQ(lost->runs(r), 0) << "row " << r;
  }
}

TEST(PieceScheduler, AnEmptyBatchIsDeliveredAtOnce) {
  BatchAllocator allocator;
  OrderedResults results(4);
  PieceScheduler scheduler(results);
  auto empty = std::make_shared<TestJob>(0, 0, 4, allocator);
  // No worker runs: push() itself delivers it.
  ASSERT_TRUE(scheduler.push(empty));
  EXPECT_EQ(results.ready_count(), 1);
  EXPECT_EQ(empty->allocations(), 1);
  EXPECT_EQ(empty->finishes(), 1);
  Batch out;
  ASSERT_EQ(results.next(&out, 0), Status::kBatch);
  EXPECT_EQ(out.sequence, 0);
  EXPECT_EQ(out.size, 0);
  // Its allocation can fail too: the batch is then that error.
  auto lost = std::make_shared<TestJob>(1, 0, 4, allocator);
  lost->allocate_error = data_error("no memory for an empty batch");
  ASSERT_TRUE(scheduler.push(lost));
  EXPECT_EQ(results.ready_count(), 1);
  const std::optional<Error> e = next_error(results);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "no memory for an empty batch");
  EXPECT_EQ(lost->finishes(), 0);
}

TEST(PieceScheduler, EndLetsWorkersDrainTheQueueThenReturn) {
  BatchAllocator allocator;
  OrderedResults results(8);
  PieceScheduler scheduler(results);
  // The first piece holds its worker until end() was called, so end() comes
  // while every batch still has pieces queued.
  Gate ended;
  std::vector<std::shared_ptr<TestJob>> jobs;
  for (int64_t s = 0; s < 4; ++s) jobs.push_back(std::make_shared<TestJob>(s, 6, 2, allocator));
  jobs[0]->on_piece = [&](size_t begin, size_t) {
    if (begin == 0) {
      EXPECT_TRUE(ended.wait());
    }
  };
  Workers workers(scheduler, results, 2);
  for (const auto& job : jobs) ASSERT_TRUE(scheduler.push(job));
  scheduler.end();
  ended.open();
  ASSERT_TRUE(workers.join());
  EXPECT_EQ(results.ready_count(), 4);
  for (const auto& job : jobs) {
    for (size_t r = 0; r < 6; ++r) EXPECT_EQ(job->runs(r), 1) << "batch " << job->sequence();
  }
  results.finish(4);
  for (int64_t s = 0; s < 4; ++s) {
    Batch out;
    ASSERT_EQ(next(results, &out), Status::kBatch);
    expect_rows(out, s, 6);
  }
}

TEST(PieceScheduler, EndWithNothingQueuedReleasesIdleWorkers) {
  OrderedResults results(4);
  PieceScheduler scheduler(results);
  Workers workers(scheduler, results, 3);
  scheduler.end();
  EXPECT_TRUE(workers.join());
}

TEST(PieceScheduler, CloseDropsQueuedBatchesAndWorkersReturn) {
  BatchAllocator allocator;
  OrderedResults results(8);
  PieceScheduler scheduler(results);
  StartLog log;
  Gate closed;
  // One worker is held inside batch 0's first piece while close() is called.
  auto held = std::make_shared<TestJob>(0, 4, 2, allocator, &log);
  held->on_piece = [&](size_t begin, size_t) {
    if (begin == 0) {
      EXPECT_TRUE(closed.wait());
    }
  };
  auto queued = std::make_shared<TestJob>(1, 4, 2, allocator, &log);
  ASSERT_TRUE(scheduler.push(held));
  ASSERT_TRUE(scheduler.push(queued));
  Workers workers(scheduler, results, 1);
  ASSERT_TRUE(log.wait_for(1, kHangGuard));
  scheduler.close();
  closed.open();
  // Never ended: only close() lets the worker return.
  ASSERT_TRUE(workers.join());
  EXPECT_EQ(log.starts(), (std::vector<std::pair<int64_t, size_t>>{{0, 0}}));
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(held->runs(r), r < 2 ? 1 : 0) << "row " << r;
    EXPECT_EQ(queued->runs(r), 0) << "row " << r;
  }
  EXPECT_EQ(results.ready_count(), 0);  // batch 0 lost its last piece: never delivered
  EXPECT_FALSE(scheduler.push(std::make_shared<TestJob>(2, 1, 1, allocator)));
  EXPECT_FALSE(scheduler.push(std::make_shared<TestJob>(3, 0, 1, allocator)));
  EXPECT_EQ(results.ready_count(), 0);
}

TEST(PieceScheduler, CloseReleasesIdleWorkers) {
  OrderedResults results(4);
  PieceScheduler scheduler(results);
  Workers workers(scheduler, results, 3);
  scheduler.close();
  EXPECT_TRUE(workers.join());
}

TEST(PieceScheduler, APieceStartsOnlyOnceItsBatchHasASlot) {
  BatchAllocator allocator;
  constexpr int64_t kSlots = 2;
  OrderedResults results(kSlots);
  PieceScheduler scheduler(results);
  StartLog log;
  std::atomic<int> started_without_slot{0};
  std::vector<std::shared_ptr<TestJob>> jobs;
  for (int64_t s = 0; s < 4; ++s) {
    auto job = std::make_shared<TestJob>(s, 1, 1, allocator, &log);
    job->on_piece = [&, s](size_t, size_t) {
      if (s >= results.consumed() + kSlots) started_without_slot.fetch_add(1);
    };
    jobs.push_back(job);
    ASSERT_TRUE(scheduler.push(job));
  }
  scheduler.end();
  results.finish(4);
  Workers workers(scheduler, results, 3);
  ASSERT_TRUE(log.wait_for(2, kHangGuard));
  EXPECT_FALSE(log.wait_for(3, kStillBlocked)) << "batch 2 started before batch 0 was consumed";
  Batch out;
  ASSERT_EQ(next(results, &out), Status::kBatch);
  expect_rows(out, 0, 1);
  ASSERT_TRUE(log.wait_for(3, kHangGuard));
  EXPECT_FALSE(log.wait_for(4, kStillBlocked)) << "batch 3 started before batch 1 was consumed";
  for (int64_t s = 1; s < 4; ++s) {
    ASSERT_EQ(next(results, &out), Status::kBatch);
    expect_rows(out, s, 1);
  }
  ASSERT_TRUE(workers.join());
  EXPECT_EQ(started_without_slot.load(), 0);
}

TEST(PieceScheduler, AWorkerWaitingForASlotReturnsWhenTheResultsClose) {
  BatchAllocator allocator;
  OrderedResults results(1);
  PieceScheduler scheduler(results);
  StartLog log;
  auto first = std::make_shared<TestJob>(0, 1, 1, allocator, &log);
  auto second = std::make_shared<TestJob>(1, 1, 1, allocator, &log);
  ASSERT_TRUE(scheduler.push(first));
  ASSERT_TRUE(scheduler.push(second));
  Workers workers(scheduler, results, 1);
  ASSERT_TRUE(log.wait_for(1, kHangGuard));
  // Batch 0 is never consumed: the worker waits for batch 1's slot until the
  // consumer goes away.
  results.close();
  ASSERT_TRUE(workers.join());
  EXPECT_EQ(second->runs(0), 0);
}

TEST(PieceScheduler, NoMoreThanTheActiveLimitOfWorkersRunPiecesAtOnce) {
  BatchAllocator allocator;
  OrderedResults results(8);
  PieceScheduler scheduler(results);
  scheduler.set_active_limit(2);
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  std::vector<std::shared_ptr<TestJob>> jobs;
  for (int64_t s = 0; s < 6; ++s) {
    auto job = std::make_shared<TestJob>(s, 8, 1, allocator);
    job->on_piece = [&](size_t, size_t) {
      const int now = running.fetch_add(1) + 1;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(1ms);
      running.fetch_sub(1);
    };
    jobs.push_back(job);
  }
  {
    Workers workers(scheduler, results, 4);
    for (auto& job : jobs) ASSERT_TRUE(scheduler.push(job));
    scheduler.end();
    results.finish(6);
    for (int64_t s = 0; s < 6; ++s) {
      Batch out;
      ASSERT_EQ(next(results, &out), Status::kBatch);
      expect_rows(out, s, 8);
    }
    ASSERT_TRUE(workers.join());
  }
  EXPECT_LE(most.load(), 2);
  EXPECT_GE(most.load(), 1);
}

TEST(PieceScheduler, RaisingTheActiveLimitLetsAWaitingWorkerIn) {
  BatchAllocator allocator;
  OrderedResults results(8);
  PieceScheduler scheduler(results);
  StartLog log;
  scheduler.set_active_limit(1);
  Gate release;
  auto job = std::make_shared<TestJob>(0, 2, 1, allocator, &log);
  job->on_piece = [&](size_t begin, size_t) {
    if (begin == 0) {
      EXPECT_TRUE(release.wait());
    }
  };
  Workers workers(scheduler, results, 2);
  ASSERT_TRUE(scheduler.push(job));
  ASSERT_TRUE(log.wait_for(1, kHangGuard));
  // The one active worker holds piece 0; the other may not take piece 1.
  EXPECT_FALSE(log.wait_for(2, kStillBlocked));
  scheduler.set_active_limit(2);
  EXPECT_TRUE(log.wait_for(2, kHangGuard));
  release.open();
  scheduler.end();
  results.finish(1);
  Batch out;
  ASSERT_EQ(next(results, &out), Status::kBatch);
  expect_rows(out, 0, 2);
  EXPECT_TRUE(workers.join());
}

TEST(PieceScheduler, AWorkerPastTheLimitFinishesTheBatchItAllocated) {
  // Worker A runs batch 0 while worker B allocates batch 1; A then takes the
  // piece of batch 2 and waits for its slot (one batch in flight), which only
  // batch 1's delivery frees. With the limit lowered to one worker, B (the
  // second worker, past the limit) must still run batch 1's other pieces, or
  // nothing would ever run them.
  BatchAllocator allocator;
  OrderedResults results(3);
  PieceScheduler scheduler(results);
  StartLog log;
  Gate first_held, allocation_held;
  std::atomic<bool> allocating{false};
  auto warm = std::make_shared<TestJob>(0, 1, 1, allocator, &log);
  warm->on_piece = [&](size_t, size_t) { EXPECT_TRUE(first_held.wait()); };
  auto middle = std::make_shared<TestJob>(1, 3, 1, allocator, &log);
  middle->on_allocate = [&] {
    allocating.store(true);
    EXPECT_TRUE(allocation_held.wait());
  };
  auto last = std::make_shared<TestJob>(2, 1, 1, allocator, &log);
  ASSERT_TRUE(scheduler.push(warm));
  Workers a(scheduler, results, 1);
  ASSERT_TRUE(log.wait_for(1, kHangGuard));  // A (worker 0) holds batch 0
  Workers b(scheduler, results, 1);
  ASSERT_TRUE(scheduler.push(middle));
  ASSERT_TRUE(scheduler.push(last));
  const auto deadline = std::chrono::steady_clock::now() + kHangGuard;
  while (!allocating.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(allocating.load());  // B (worker 1) allocates batch 1
  results.set_max_in_flight(1);
  first_held.open();
  Batch out;
  ASSERT_EQ(next(results, &out), Status::kBatch);
  expect_rows(out, 0, 1);
  // A takes batch 2's piece (batch 1 is being allocated) and waits for its slot.
  scheduler.set_active_limit(1);
  allocation_held.open();
  scheduler.end();
  results.finish(3);
  for (int64_t s = 1; s < 3; ++s) {
    ASSERT_EQ(next(results, &out), Status::kBatch);
    expect_rows(out, s, s == 1 ? 3 : 1);
  }
  EXPECT_TRUE(a.join());
  EXPECT_TRUE(b.join());
}

TEST(PieceScheduler, ActiveWorkersAndTheirTimeFollowTheLimit) {
  BatchAllocator allocator;
  OrderedResults results(8);
  PieceScheduler scheduler(results);
  EXPECT_EQ(scheduler.active_workers(), 0);
  {
    Workers workers(scheduler, results, 3);
    const auto deadline = std::chrono::steady_clock::now() + kHangGuard;
    while (scheduler.active_workers() < 3 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(scheduler.active_workers(), 3);
    scheduler.set_active_limit(2);
    EXPECT_EQ(scheduler.active_workers(), 2);
    scheduler.set_active_limit(0);  // at least one
    EXPECT_EQ(scheduler.active_workers(), 1);
    const uint64_t before = scheduler.active_ns();
    std::this_thread::sleep_for(5ms);
    EXPECT_GE(scheduler.active_ns() - before, uint64_t{5'000'000});
    scheduler.end();
    EXPECT_TRUE(workers.join());
  }
  // Workers that returned have no time left to count; the count is the last one.
  EXPECT_EQ(scheduler.active_workers(), 1);
  const uint64_t after = scheduler.active_ns();
  std::this_thread::sleep_for(2ms);
  EXPECT_EQ(scheduler.active_ns(), after);
}

}  // namespace
}  // namespace chute

#include "batching/piece_scheduler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/thread_group.h"

namespace chute {
namespace {

// A flag one job raises and another waits for (with a bound, so a scheduler
// that never lets the raiser run fails the test instead of hanging it).
struct Signal {
  std::mutex mutex;
  std::condition_variable cv;
  bool raised = false;

  void raise() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      raised = true;
    }
    cv.notify_all();
  }
  bool wait() {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return raised; });
  }
};

// A batch whose allocation waits for `wait_for` (when set) and whose rows
// raise `raise` (when set); it records what it saw in its batch's size.
class SignalJob final : public PieceJob {
 public:
  SignalJob(int64_t sequence, size_t rows, Signal* wait_for, Signal* raise)
      : PieceJob(sequence, rows, 1), wait_for_(wait_for), raise_(raise) {}

 private:
  void allocate() override {
    batch_.size = wait_for_ == nullptr || wait_for_->wait() ? 1 : -1;
  }
  void run(size_t, size_t) override {
    if (raise_ != nullptr) raise_->raise();
  }

  Signal* wait_for_;
  Signal* raise_;
};

TEST(PieceScheduler, WorkersRunLaterBatchesWhileOneIsAllocated) {
  // Batch 0 (two pieces) cannot finish allocating before a row of batch 1
  // has run: the second worker must take batch 1 rather than wait on batch 0.
  OrderedResults results(4);
  PieceScheduler scheduler(results);
  Signal signal;
  scheduler.push(std::make_shared<SignalJob>(0, 2, &signal, nullptr));
  scheduler.push(std::make_shared<SignalJob>(1, 1, nullptr, &signal));
  scheduler.end();
  ThreadGroup workers;
  for (int i = 0; i < 2; ++i) workers.spawn("test-worker", [&] { scheduler.work(); });
  Batch first, second;
  ASSERT_EQ(results.next(&first, 60.0), OrderedResults::Status::kBatch);
  ASSERT_EQ(results.next(&second, 60.0), OrderedResults::Status::kBatch);
  EXPECT_EQ(first.size, 1) << "batch 0 gave up waiting for batch 1";
  EXPECT_EQ(second.sequence, 1);
  workers.join();
}

TEST(PieceScheduler, ALostBatchStillReleasesItsOtherPieces) {
  class Failing final : public PieceJob {
   public:
    Failing() : PieceJob(0, 3, 1) {}

   private:
    void allocate() override { throw std::runtime_error("no memory"); }
    void run(size_t, size_t) override { ADD_FAILURE() << "a row of a lost batch ran"; }
  };
  OrderedResults results(2);
  PieceScheduler scheduler(results);
  scheduler.push(std::make_shared<Failing>());
  scheduler.end();
  ThreadGroup workers;
  for (int i = 0; i < 3; ++i) workers.spawn("test-worker", [&] { scheduler.work(); });
  Batch batch;
  EXPECT_THROW(results.next(&batch, 60.0), std::runtime_error);
  workers.join();
}

}  // namespace
}  // namespace chute

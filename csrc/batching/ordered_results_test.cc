#include "batching/ordered_results.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/testing.h"

namespace chute {
namespace {

using namespace std::chrono_literals;
using Status = OrderedResults::Status;

// Hang guard for waits that must end: far longer than any correct run needs.
constexpr auto kHangGuard = 30s;
// How long a test watches a wait that must NOT end yet. A correct
// implementation never ends it, so this cannot fail spuriously; a wrong one is
// caught unless the waiting thread is slower than this to get there.
constexpr auto kStillBlocked = 50ms;

Batch batch(int64_t sequence) {
  Batch b;
  b.sequence = sequence;
  b.size = sequence * 10;
  return b;
}

std::exception_ptr data_error(const std::string& message) {
  try {
    CHUTE_CHECK(false, kData, message);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

TEST(OrderedResults, OutOfOrderPutsComeOutInSequence) {
  OrderedResults results(8);
  for (int64_t s : {3, 0, 2, 1}) results.put(s, batch(s));
  results.finish(4);
  for (int64_t s = 0; s < 4; ++s) {
    Batch out;
    ASSERT_EQ(results.next(&out, 0), Status::kBatch);
    EXPECT_EQ(out.sequence, s);
    EXPECT_EQ(out.size, s * 10);
    EXPECT_EQ(results.consumed(), s + 1);
  }
  Batch out;
  EXPECT_EQ(results.next(&out, 0), Status::kEnd);
  EXPECT_EQ(results.next(&out, 0), Status::kEnd);
}

TEST(OrderedResults, ALaterBatchWaitsForTheEarlierOne) {
  OrderedResults results(8);
  results.put(1, batch(1));
  Batch out;
  EXPECT_EQ(results.next(&out, 0.01), Status::kTimeout);  // 0 is missing
  EXPECT_EQ(results.ready_count(), 1);
  results.put(0, batch(0));
  ASSERT_EQ(results.next(&out, 0.01), Status::kBatch);
  EXPECT_EQ(out.sequence, 0);
  ASSERT_EQ(results.next(&out, 0.01), Status::kBatch);
  EXPECT_EQ(out.sequence, 1);
}

TEST(OrderedResults, ErrorIsRethrownAtItsPosition) {
  OrderedResults results(8);
  results.put(2, batch(2));
  results.put_error(1, data_error("bad sample in shard 's.tar' at offset 1024"));
  results.put(0, batch(0));
  results.finish(3);
  Batch out;
  ASSERT_EQ(results.next(&out, 0), Status::kBatch);
  EXPECT_EQ(out.sequence, 0);
  const std::optional<Error> e = test::error_from([&] { results.next(&out, 0); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(), "bad sample in shard 's.tar' at offset 1024");
  EXPECT_EQ(out.sequence, 0);  // untouched by the failed next()
  // The error took its place in the sequence; the consumer may go on.
  ASSERT_EQ(results.next(&out, 0), Status::kBatch);
  EXPECT_EQ(out.sequence, 2);
  EXPECT_EQ(results.next(&out, 0), Status::kEnd);
}

TEST(OrderedResults, FinishEndsAWaitingConsumer) {
  OrderedResults results(4);
  std::future<Status> consumer = std::async(std::launch::async, [&] {
    Batch out;
    return results.next(&out, 0);
  });
  results.finish(0);
  ASSERT_EQ(consumer.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_EQ(consumer.get(), Status::kEnd);
}

TEST(OrderedResults, TimeoutWhenNothingArrives) {
  OrderedResults results(4);
  Batch out;
  EXPECT_EQ(results.next(&out, 0.02), Status::kTimeout);
  EXPECT_EQ(results.consumed(), 0);
  // A timeout loses nothing: the batch is there for the next call.
  results.put(0, batch(0));
  EXPECT_EQ(results.next(&out, 0.02), Status::kBatch);
  EXPECT_EQ(out.sequence, 0);
}

TEST(OrderedResults, SlotsBoundTheBatchesInFlight) {
  OrderedResults results(2);
  // Batches 0 and 1 may start at once (this would hang if they could not).
  EXPECT_TRUE(results.wait_for_slot(0));
  EXPECT_TRUE(results.wait_for_slot(1));
  std::future<bool> producer =
      std::async(std::launch::async, [&] { return results.wait_for_slot(2); });
  EXPECT_EQ(producer.wait_for(kStillBlocked), std::future_status::timeout)
      << "batch 2 started while 0 and 1 were both unconsumed";
  results.put(1, batch(1));  // finishing a later batch frees nothing
  EXPECT_EQ(producer.wait_for(kStillBlocked), std::future_status::timeout);
  results.put(0, batch(0));  // nor does finishing the oldest: consuming it does
  EXPECT_EQ(producer.wait_for(kStillBlocked), std::future_status::timeout);
  Batch out;
  ASSERT_EQ(results.next(&out, 0), Status::kBatch);
  ASSERT_EQ(producer.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_TRUE(producer.get());
}

TEST(OrderedResults, AtLeastOneSlot) {
  OrderedResults results(0);
  EXPECT_TRUE(results.wait_for_slot(0));
  std::future<bool> producer =
      std::async(std::launch::async, [&] { return results.wait_for_slot(1); });
  EXPECT_EQ(producer.wait_for(kStillBlocked), std::future_status::timeout);
  results.put(0, batch(0));
  Batch out;
  ASSERT_EQ(results.next(&out, 0), Status::kBatch);
  ASSERT_EQ(producer.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_TRUE(producer.get());
}

TEST(OrderedResults, CloseWakesAWaitingConsumerAndProducer) {
  OrderedResults results(1);
  ASSERT_TRUE(results.wait_for_slot(0));
  std::future<Status> consumer = std::async(std::launch::async, [&] {
    Batch out;
    return results.next(&out, 0);  // waits forever for batch 0
  });
  std::future<bool> producer =
      std::async(std::launch::async, [&] { return results.wait_for_slot(1); });
  EXPECT_EQ(consumer.wait_for(kStillBlocked), std::future_status::timeout);
  EXPECT_EQ(producer.wait_for(kStillBlocked), std::future_status::timeout);
  results.close();
  ASSERT_EQ(consumer.wait_for(kHangGuard), std::future_status::ready);
  ASSERT_EQ(producer.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_EQ(consumer.get(), Status::kClosed);
  EXPECT_FALSE(producer.get());
}

TEST(OrderedResults, ClosedStaysClosed) {
  OrderedResults results(4);
  results.put(0, batch(0));
  results.close();
  Batch out;
  // Closing means the consumer has stopped: a ready batch is not handed out.
  EXPECT_EQ(results.next(&out, 0), Status::kClosed);
  EXPECT_EQ(results.next(&out, 0.01), Status::kClosed);
  EXPECT_FALSE(results.wait_for_slot(0));
}

TEST(OrderedResults, ManyProducersOneConsumerInOrder) {
  constexpr int64_t kBatches = 2000;
  constexpr int64_t kSlots = 4;
  OrderedResults results(kSlots);
  std::atomic<int64_t> next_sequence{0};
  std::atomic<int64_t> max_ready{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < 4; ++p) {
    producers.emplace_back([&] {
      for (;;) {
        const int64_t s = next_sequence.fetch_add(1);
        if (s >= kBatches) return;
        if (!results.wait_for_slot(s)) return;
        if (s % 97 == 13) {
          results.put_error(s, data_error("batch " + std::to_string(s)));
        } else {
          results.put(s, batch(s));
        }
        const int64_t ready = results.ready_count();
        int64_t seen = max_ready.load();
        while (ready > seen && !max_ready.compare_exchange_weak(seen, ready)) {
        }
      }
    });
  }
  std::thread finisher([&] {
    for (std::thread& t : producers) t.join();
    results.finish(kBatches);
  });
  // On any way out of this test, a failed assertion included: release the
  // producers, then wait for them.
  struct Cleanup {
    OrderedResults& results;
    std::thread& finisher;
    ~Cleanup() {
      results.close();
      finisher.join();
    }
  } cleanup{results, finisher};
  int64_t expected = 0;
  for (;;) {
    Batch out;
    Status status = Status::kTimeout;
    const std::optional<Error> e = test::error_from([&] { status = results.next(&out, 30.0); });
    if (e) {
      EXPECT_EQ(expected % 97, 13);
      EXPECT_EQ(e->message(), "batch " + std::to_string(expected));
      ++expected;
      continue;
    }
    ASSERT_NE(status, Status::kTimeout) << "hang guard";
    if (status == Status::kEnd) break;
    ASSERT_EQ(status, Status::kBatch);
    EXPECT_EQ(out.sequence, expected);
    ++expected;
  }
  EXPECT_EQ(expected, kBatches);
  EXPECT_EQ(results.consumed(), kBatches);
  // A producer only starts batch s once s < consumed + slots, so at most
  // `slots` batches are ever waiting for the consumer.
  EXPECT_LE(max_ready.load(), kSlots);
}

TEST(OrderedResults, BytesInFlightAreBoundedAndFreedWhenConsumed) {
  OrderedResults results(8, 100);
  ASSERT_TRUE(results.wait_for_slot(0, 60));
  EXPECT_EQ(results.bytes_in_flight(), 60u);
  // 60 + 50 > 100: batch 1 waits for batch 0 to be consumed.
  auto second = std::async(std::launch::async, [&] { return results.wait_for_slot(1, 50); });
  EXPECT_EQ(second.wait_for(kStillBlocked), std::future_status::timeout);
  results.put(0, batch(0));
  Batch out;
  ASSERT_EQ(results.next(&out, 0), Status::kBatch);
  ASSERT_EQ(second.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_TRUE(second.get());
  EXPECT_EQ(results.bytes_in_flight(), 50u);
  // Within the bound, batches go together.
  EXPECT_TRUE(results.wait_for_slot(2, 40));
  EXPECT_EQ(results.bytes_in_flight(), 90u);
}

TEST(OrderedResults, ABatchLargerThanTheByteBoundGoesAlone) {
  OrderedResults results(8, 100);
  ASSERT_TRUE(results.wait_for_slot(0, 500));  // nothing in flight: it may go
  // Its workers, which state no bytes, are not held back by its own.
  EXPECT_TRUE(results.wait_for_slot(0));
  auto next = std::async(std::launch::async, [&] { return results.wait_for_slot(1, 1); });
  EXPECT_EQ(next.wait_for(kStillBlocked), std::future_status::timeout);
  results.put(0, batch(0));
  Batch out;
  ASSERT_EQ(results.next(&out, 0), Status::kBatch);
  ASSERT_EQ(next.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_TRUE(next.get());
  EXPECT_EQ(results.bytes_in_flight(), 1u);
}

TEST(OrderedResults, CloseEndsAWaitForBytes) {
  OrderedResults results(8, 10);
  ASSERT_TRUE(results.wait_for_slot(0, 10));
  auto blocked = std::async(std::launch::async, [&] { return results.wait_for_slot(1, 10); });
  EXPECT_EQ(blocked.wait_for(kStillBlocked), std::future_status::timeout);
  results.close();
  ASSERT_EQ(blocked.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_FALSE(blocked.get());
}

TEST(OrderedResults, RaisingTheBoundLetsAWaitingProducerIn) {
  OrderedResults results(1);
  EXPECT_TRUE(results.wait_for_slot(0));
  std::future<bool> producer =
      std::async(std::launch::async, [&] { return results.wait_for_slot(1); });
  EXPECT_EQ(producer.wait_for(kStillBlocked), std::future_status::timeout);
  results.set_max_in_flight(2);
  ASSERT_EQ(producer.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_TRUE(producer.get());
  EXPECT_EQ(results.max_in_flight(), 2);
  results.set_max_in_flight(0);  // at least one slot
  EXPECT_EQ(results.max_in_flight(), 1);
}

TEST(OrderedResults, LoweringTheBoundHoldsTheNextProducerBack) {
  OrderedResults results(3);
  EXPECT_TRUE(results.wait_for_slot(0));
  EXPECT_TRUE(results.wait_for_slot(1));
  results.set_max_in_flight(1);
  std::future<bool> producer =
      std::async(std::launch::async, [&] { return results.wait_for_slot(2); });
  results.put(0, batch(0));
  Batch out;
  ASSERT_EQ(results.next(&out, 0), Status::kBatch);
  // One consumed: 2 is still two ahead of the consumer, past the new bound.
  EXPECT_EQ(producer.wait_for(kStillBlocked), std::future_status::timeout);
  results.put(1, batch(1));
  ASSERT_EQ(results.next(&out, 0), Status::kBatch);
  ASSERT_EQ(producer.wait_for(kHangGuard), std::future_status::ready);
  EXPECT_TRUE(producer.get());
}

TEST(OrderedResults, OccupancyCountsTheBatchesReadyAndTheWaits) {
  OrderedResults results(8);
  for (int64_t s : {0, 1, 2}) results.put(s, batch(s));
  Batch out;
  for (int i = 0; i < 3; ++i) ASSERT_EQ(results.next(&out, 0), Status::kBatch);
  // 3, 2 and 1 batches were ready when the consumer took each; none waited.
  EXPECT_EQ(results.occupancy().ready_seen, 6u);
  EXPECT_EQ(results.occupancy().waits, 0u);
  // Batch 3 is waited for over several timed calls: one wait.
  EXPECT_EQ(results.next(&out, 0.001), Status::kTimeout);
  EXPECT_EQ(results.next(&out, 0.001), Status::kTimeout);
  results.put(3, batch(3));
  ASSERT_EQ(results.next(&out, 0), Status::kBatch);
  EXPECT_EQ(results.occupancy().ready_seen, 7u);
  EXPECT_EQ(results.occupancy().waits, 1u);
}

}  // namespace
}  // namespace chute

#include "memory/batch_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/testing.h"

namespace chute {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = size_t{2} << 20;

bool aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

TEST(BatchAllocator, SizesAreRoundedUpToPowersOfTwoFromOnePage) {
  BatchAllocator allocator;
  const std::pair<size_t, size_t> cases[] = {
      {0, 4096}, {1, 4096}, {4096, 4096}, {4097, 8192}, {5000, 8192}, {100000, 131072}};
  for (const auto& [request, size] : cases) {
    const std::shared_ptr<Block> b = allocator.allocate(request);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->size(), size) << "request " << request;
    EXPECT_TRUE(aligned(b->data(), kPage)) << "request " << request;
    std::memset(b->data(), 0xab, b->size());  // all of it is ours to write
  }
}

TEST(BatchAllocator, LargeArenasAreHugePageAligned) {
  BatchAllocator allocator;
  const std::shared_ptr<Block> b = allocator.allocate(3 << 20);
  EXPECT_EQ(b->size(), size_t{4} << 20);
  EXPECT_TRUE(aligned(b->data(), kHugePage));
  std::memset(b->data(), 1, b->size());
}

TEST(BatchAllocator, ReleasedArenaIsReused) {
  BatchAllocator allocator;
  uint8_t* first = nullptr;
  {
    const std::shared_ptr<Block> b = allocator.allocate(10000);
    first = b->data();
    EXPECT_EQ(allocator.stats().bytes_in_use, 16384u);
  }
  AllocatorStats s = allocator.stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.bytes_reserved, 16384u);  // kept for the next batch
  const std::shared_ptr<Block> again = allocator.allocate(9000);
  EXPECT_EQ(again->data(), first);
  s = allocator.stats();
  EXPECT_EQ(s.arenas_created, 1u);
  EXPECT_EQ(s.bytes_in_use, 16384u);
}

TEST(BatchAllocator, ABiggerIdleArenaServesUpToTwoSizeClassesDown) {
  BatchAllocator allocator;
  uint8_t* big = nullptr;
  {
    const std::shared_ptr<Block> b = allocator.allocate(16384);
    big = b->data();
  }
  {
    // A partial last batch (a quarter of the size) takes the full batch's arena.
    const std::shared_ptr<Block> small = allocator.allocate(4096);
    EXPECT_EQ(small->data(), big);
    EXPECT_EQ(small->size(), 16384u);
  }
  {
    // Three classes down is too wasteful: a new arena.
    BatchAllocator other;
    { const std::shared_ptr<Block> b = other.allocate(32768); }
    const std::shared_ptr<Block> tiny = other.allocate(100);
    EXPECT_EQ(tiny->size(), 4096u);
    EXPECT_EQ(other.stats().arenas_created, 2u);
  }
}

TEST(BatchAllocator, StatsTrackUseReservationAndPeaks) {
  BatchAllocator allocator;
  {
    const std::shared_ptr<Block> a = allocator.allocate(4096);
    const std::shared_ptr<Block> b = allocator.allocate(8192);
    const AllocatorStats s = allocator.stats();
    EXPECT_EQ(s.arenas_created, 2u);
    EXPECT_EQ(s.bytes_in_use, 12288u);
    EXPECT_EQ(s.bytes_reserved, 12288u);
    EXPECT_EQ(s.bytes_pinned, 0u);
  }
  const AllocatorStats s = allocator.stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.bytes_reserved, 12288u);
  EXPECT_EQ(s.peak_bytes_in_use, 12288u);
  EXPECT_EQ(s.peak_bytes_reserved, 12288u);
}

TEST(BatchAllocator, IdleArenasBeyondTheCacheLimitGoBack) {
  BatchAllocator allocator(8192);
  {
    const std::shared_ptr<Block> a = allocator.allocate(8192);
    const std::shared_ptr<Block> b = allocator.allocate(8192);
    EXPECT_EQ(allocator.stats().bytes_reserved, 16384u);
  }
  // One fits under the 8 KiB limit, the other was freed.
  EXPECT_EQ(allocator.stats().bytes_reserved, 8192u);
}

TEST(BatchAllocator, BlocksOutliveTheAllocator) {
  std::shared_ptr<Block> kept;
  {
    BatchAllocator allocator;
    kept = allocator.allocate(1000);
    { const std::shared_ptr<Block> cached = allocator.allocate(50000); }
  }
  // Still valid memory (ASan would report otherwise), freed when let go.
  std::memset(kept->data(), 7, kept->size());
  EXPECT_EQ(kept->data()[kept->size() - 1], 7);
  kept.reset();
}

TEST(BatchAllocator, ConcurrentAllocationsBalance) {
  BatchAllocator allocator;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&allocator, t] {
      std::vector<std::shared_ptr<Block>> held;
      for (int i = 0; i < 500; ++i) {
        held.push_back(allocator.allocate(static_cast<size_t>(1000 * (1 + (i + t) % 20))));
        held.back()->data()[0] = static_cast<uint8_t>(i);
        if (held.size() > 3) held.erase(held.begin());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const AllocatorStats s = allocator.stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_LE(s.peak_bytes_in_use, s.peak_bytes_reserved);
  // Reuse: far fewer arenas than the 2000 allocations.
  EXPECT_LT(s.arenas_created, 200u);
}

// Page-locking hooks with cudaHostRegister's signature that record the calls.
struct PinLog {
  int registered = 0;
  int unregistered = 0;
  int fail_with = 0;
};
PinLog g_pins;
int fake_register(void* ptr, size_t size, unsigned int flags) {
  EXPECT_TRUE(aligned(ptr, kPage));
  EXPECT_EQ(size % kPage, 0u);
  EXPECT_EQ(flags, 0u);
  if (g_pins.fail_with != 0) return g_pins.fail_with;
  g_pins.registered += 1;
  return 0;
}
int fake_unregister(void*) {
  g_pins.unregistered += 1;
  return 0;
}

TEST(BatchAllocator, PinHooksRunOncePerArena) {
  g_pins = PinLog{};
  {
    BatchAllocator allocator;
    allocator.set_pin_hooks(PinHooks{fake_register, fake_unregister});
    for (int i = 0; i < 5; ++i) {
      const std::shared_ptr<Block> b = allocator.allocate(20000);  // the same arena every time
    }
    EXPECT_EQ(g_pins.registered, 1);
    EXPECT_EQ(g_pins.unregistered, 0);
    EXPECT_EQ(allocator.stats().bytes_pinned, 32768u);
  }
  EXPECT_EQ(g_pins.unregistered, 1);  // right before the arena was freed
}

TEST(BatchAllocator, FailedPinningIsAnIoError) {
  g_pins = PinLog{};
  g_pins.fail_with = 2;
  BatchAllocator allocator;
  allocator.set_pin_hooks(PinHooks{fake_register, fake_unregister});
  const std::optional<Error> e = test::error_from([&] { allocator.allocate(4096); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kIo);
  EXPECT_EQ(e->message(), "cudaHostRegister of a 4096-byte batch buffer failed with error 2");
  EXPECT_EQ(allocator.stats().bytes_reserved, 0u);
  g_pins.fail_with = 0;
}

TEST(BatchAllocator, PinHooksAfterTheFirstArenaAreAUsageError) {
  BatchAllocator allocator;
  { const std::shared_ptr<Block> b = allocator.allocate(1); }
  const std::optional<Error> e = test::error_from(
      [&] { allocator.set_pin_hooks(PinHooks{fake_register, fake_unregister}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
}

}  // namespace
}  // namespace chute

#include "memory/batch_allocator.h"

#include <cstdint>
#include <cstdlib>
#include <new>

#include <sys/mman.h>

#include "core/error.h"

namespace chute {

namespace {

constexpr size_t kMinArena = 4096;
constexpr size_t kAlignment = 4096;  // page-aligned, so cudaHostRegister covers whole pages

size_t round_up_pow2(size_t n) {
  size_t size = kMinArena;
  while (size < n) size <<= 1;
  return size;
}

// Arenas of at least this size are mapped on 2 MiB boundaries and offered to
// transparent huge pages: a fresh batch buffer then faults in once per 2 MiB
// instead of once per 4 KiB, and the faults of an epoch's first batches cost
// a visible share of its CPU time otherwise (benchmarks/README.md,
// "Measurements behind code choices"). Where THP is off, madvise is refused
// silently and 4 KiB pages are used.
constexpr size_t kHugePage = size_t{2} << 20;

uint8_t* map_arena(size_t size) {
  // Over-map by one huge page and cut the ends off, leaving an aligned range.
  const size_t span = size + kHugePage;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (base + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
  if (aligned > base) ::munmap(p, aligned - base);
  const uintptr_t tail = base + span - (aligned + size);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + size), tail);
#ifdef MADV_HUGEPAGE
  ::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
#endif
  return reinterpret_cast<uint8_t*>(aligned);
}

uint8_t* new_arena(size_t size) {
  if (size >= kHugePage) return map_arena(size);
  void* p = nullptr;
  return posix_memalign(&p, kAlignment, size) == 0 ? static_cast<uint8_t*>(p) : nullptr;
}

// Sizes are powers of two, so `size` alone says which way it was made.
void delete_arena(uint8_t* data, size_t size) {
  if (size >= kHugePage) {
    ::munmap(data, size);
  } else {
    std::free(data);
  }
}

}  // namespace

struct BatchAllocator::Pool {
  explicit Pool(size_t max_cached) : max_cached_bytes(max_cached) {}
  ~Pool() {
    for (auto& entry : free_lists) {
      for (uint8_t* p : entry.second) free_arena(p, entry.first);
    }
  }

  void free_arena(uint8_t* data, size_t size) {
    if (hooks.enabled()) hooks.unregister_fn(data);
    delete_arena(data, size);
  }

  void release(uint8_t* data, size_t size) {
    std::lock_guard<std::mutex> lock(mutex);
    stats.bytes_in_use -= size;
    if (closed || cached_bytes + size > max_cached_bytes) {
      free_arena(data, size);
      stats.bytes_reserved -= size;
      if (hooks.enabled()) stats.bytes_pinned -= size;
      return;
    }
    free_lists[size].push_back(data);
    cached_bytes += size;
  }

  mutable std::mutex mutex;
  size_t max_cached_bytes;
  size_t cached_bytes = 0;
  bool closed = false;
  PinHooks hooks;
  std::map<size_t, std::vector<uint8_t*>> free_lists;
  AllocatorStats stats;
};

BatchAllocator::BatchAllocator(size_t max_cached_bytes)
    : pool_(std::make_shared<Pool>(max_cached_bytes)) {}

BatchAllocator::~BatchAllocator() {
  // Cached arenas are freed now (Pool's destructor runs once the last live
  // block is gone); blocks still viewed free themselves on release.
  std::lock_guard<std::mutex> lock(pool_->mutex);
  pool_->closed = true;
  for (auto& entry : pool_->free_lists) {
    for (uint8_t* p : entry.second) {
      pool_->free_arena(p, entry.first);
      pool_->stats.bytes_reserved -= entry.first;
      if (pool_->hooks.enabled()) pool_->stats.bytes_pinned -= entry.first;
    }
  }
  pool_->free_lists.clear();
  pool_->cached_bytes = 0;
}

std::shared_ptr<Block> BatchAllocator::allocate(size_t bytes) {
  size_t size = round_up_pow2(bytes);
  uint8_t* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool_->mutex);
    // An idle arena up to two size classes larger serves too: the partial
    // last batch of an epoch then reuses a full batch's pages, already
    // faulted in, instead of touching fresh ones (first touches are what
    // batch memory costs).
    for (auto it = pool_->free_lists.lower_bound(size);
         it != pool_->free_lists.end() && it->first <= size * 4; ++it) {
      if (it->second.empty()) continue;
      data = it->second.back();
      it->second.pop_back();
      size = it->first;
      pool_->cached_bytes -= size;
      break;
    }
  }
  if (data == nullptr) {
    data = new_arena(size);
    CHUTE_CHECK(data != nullptr, kMemory,
                "out of memory: cannot map a batch buffer of " << size << " bytes");
    PinHooks hooks;
    {
      std::lock_guard<std::mutex> lock(pool_->mutex);
      hooks = pool_->hooks;
    }
    if (hooks.enabled()) {
      const int status = hooks.register_fn(data, size, 0);
      if (status != 0) delete_arena(data, size);
      CHUTE_CHECK(status == 0, kIo,
                  "cudaHostRegister of a " << size << "-byte batch buffer failed with error " << status);
    }
    std::lock_guard<std::mutex> lock(pool_->mutex);
    if (hooks.enabled()) pool_->stats.bytes_pinned += size;
    pool_->stats.arenas_created += 1;
    pool_->stats.bytes_reserved += size;
    if (pool_->stats.bytes_reserved > pool_->stats.peak_bytes_reserved) {
      pool_->stats.peak_bytes_reserved = pool_->stats.bytes_reserved;
    }
  }
  {
    std::lock_guard<std::mutex> lock(pool_->mutex);
    pool_->stats.bytes_in_use += size;
    if (pool_->stats.bytes_in_use > pool_->stats.peak_bytes_in_use) {
      pool_->stats.peak_bytes_in_use = pool_->stats.bytes_in_use;
    }
  }
  std::shared_ptr<Pool> pool = pool_;
  Block* block = new Block(data, size);
  return std::shared_ptr<Block>(block, [pool](Block* b) {
    pool->release(b->data_, b->size_);
    delete b;
  });
}

AllocatorStats BatchAllocator::stats() const {
  std::lock_guard<std::mutex> lock(pool_->mutex);
  return pool_->stats;
}

void BatchAllocator::set_pin_hooks(PinHooks hooks) {
  std::lock_guard<std::mutex> lock(pool_->mutex);
  CHUTE_CHECK(pool_->stats.arenas_created == 0, kUsage,
              "pin hooks must be set before the first batch is allocated");
  pool_->hooks = hooks;
}

}  // namespace chute

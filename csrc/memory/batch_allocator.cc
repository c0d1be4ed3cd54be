#include "memory/batch_allocator.h"

#include <cstdlib>
#include <new>

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

}  // namespace

struct BatchAllocator::Pool {
  explicit Pool(size_t max_cached) : max_cached_bytes(max_cached) {}
  ~Pool() {
    for (auto& entry : free_lists) {
      for (uint8_t* p : entry.second) free_arena(p);
    }
  }

  void free_arena(uint8_t* data) {
    if (hooks.enabled()) hooks.unregister_fn(data);
    std::free(data);
  }

  void release(uint8_t* data, size_t size) {
    std::lock_guard<std::mutex> lock(mutex);
    stats.bytes_in_use -= size;
    if (closed || cached_bytes + size > max_cached_bytes) {
      free_arena(data);
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
      pool_->free_arena(p);
      pool_->stats.bytes_reserved -= entry.first;
      if (pool_->hooks.enabled()) pool_->stats.bytes_pinned -= entry.first;
    }
  }
  pool_->free_lists.clear();
  pool_->cached_bytes = 0;
}

std::shared_ptr<Block> BatchAllocator::allocate(size_t bytes) {
  const size_t size = round_up_pow2(bytes);
  uint8_t* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool_->mutex);
    auto it = pool_->free_lists.find(size);
    if (it != pool_->free_lists.end() && !it->second.empty()) {
      data = it->second.back();
      it->second.pop_back();
      pool_->cached_bytes -= size;
    }
  }
  if (data == nullptr) {
    void* p = nullptr;
    CHUTE_CHECK(posix_memalign(&p, kAlignment, size) == 0, kIo,
                "out of memory allocating a batch buffer of " << size << " bytes");
    data = static_cast<uint8_t*>(p);
    PinHooks hooks;
    {
      std::lock_guard<std::mutex> lock(pool_->mutex);
      hooks = pool_->hooks;
    }
    if (hooks.enabled()) {
      const int status = hooks.register_fn(data, size, 0);
      if (status != 0) std::free(data);
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

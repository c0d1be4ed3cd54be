// Batch memory. Every batch buffer is an arena obtained from the OS once and
// recycled: a Block handed out by allocate() returns its arena to the free
// list when the last shared_ptr to it dies (for Python that is when the last
// numpy array / tensor viewing it is collected), so a steady-state epoch
// allocates nothing. Arenas are never freed while viewed.
//
// Arena sizes are rounded up to a power of two (min 4 KiB) so buffers for
// batches of slightly different shape (a partial batch, a variable image)
// land in the same size class. Idle arenas above `max_cached_bytes` go back to
// the OS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace chute {

struct AllocatorStats {
  uint64_t arenas_created = 0;   // arenas ever obtained from the OS
  uint64_t bytes_reserved = 0;   // bytes of arenas alive (in use + cached)
  uint64_t bytes_in_use = 0;     // bytes of arenas handed out and still viewed
  uint64_t peak_bytes_reserved = 0;
  uint64_t peak_bytes_in_use = 0;
  uint64_t bytes_pinned = 0;     // bytes of arenas registered page-locked
};

// Page-locking hooks, with cudaHostRegister's and cudaHostUnregister's C
// signatures. Python looks the two functions up in the CUDA runtime that
// torch loaded and passes their addresses, so the engine pins each arena once
// when it is created and unpins it right before it is freed, on whatever
// thread that happens, without linking CUDA or calling into Python.
struct PinHooks {
  int (*register_fn)(void* ptr, size_t size, unsigned int flags) = nullptr;
  int (*unregister_fn)(void* ptr) = nullptr;
  bool enabled() const { return register_fn != nullptr && unregister_fn != nullptr; }
};

class Block {
 public:
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  friend class BatchAllocator;
  Block(uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t* data_;
  size_t size_;  // the arena's full (rounded) size
};

class BatchAllocator {
 public:
  explicit BatchAllocator(size_t max_cached_bytes = size_t{1} << 30);
  ~BatchAllocator();
  BatchAllocator(const BatchAllocator&) = delete;
  BatchAllocator& operator=(const BatchAllocator&) = delete;

  // A zero-size request still returns a valid (1-page) block.
  std::shared_ptr<Block> allocate(size_t bytes);

  AllocatorStats stats() const;

  // Set before the first allocate(); arenas made from then on are pinned.
  void set_pin_hooks(PinHooks hooks);

 private:
  struct Pool;
  std::shared_ptr<Pool> pool_;  // shared with the blocks' deleters, which may outlive us
};

}  // namespace chute

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
#include <utility>
#include <vector>

namespace chute {

struct AllocatorStats {
  uint64_t arenas_created = 0;   // arenas ever obtained from the OS
  uint64_t bytes_reserved = 0;   // bytes of arenas alive (in use + cached)
  uint64_t bytes_in_use = 0;     // bytes of arenas handed out and still viewed
  uint64_t peak_bytes_reserved = 0;
  uint64_t peak_bytes_in_use = 0;
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

  // With tracking on (only when batches are to be pinned), take_new_arenas()
  // returns the arenas created since its last call, so the Python side can
  // page-lock (cudaHostRegister) each once, right after it is made.
  void set_track_new_arenas(bool track);
  std::vector<std::pair<void*, size_t>> take_new_arenas();

 private:
  struct Pool;
  std::shared_ptr<Pool> pool_;  // shared with the blocks' deleters, which may outlive us
};

}  // namespace chute

// Decompressed chunks (and fixed blocks of unfiltered datasets) shared by all
// engine threads, bounded in bytes, least recently used evicted first (with
// the lazy, second-chance approximation described at Entry). Concurrent requests for a chunk that is being
// decompressed wait for that one decompression instead of repeating it (two
// threads splitting one sequential batch otherwise inflate every chunk twice).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace chute::h5 {

struct ChunkKey {
  uint64_t source = 0;  // which dataset (a unique id per H5RowSource)
  uint64_t chunk = 0;   // (file index << 32) | chunk index
  bool operator==(const ChunkKey& o) const { return source == o.source && chunk == o.chunk; }
};

struct ChunkKeyHash {
  size_t operator()(const ChunkKey& k) const {
    return std::hash<uint64_t>()(k.source * 0x9e3779b97f4a7c15ULL ^ k.chunk);
  }
};

struct ChunkCacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t bytes = 0;       // decompressed bytes held now
  uint64_t capacity = 0;
};

class ChunkCache {
 public:
  using Data = std::shared_ptr<const std::vector<uint8_t>>;
  using Loader = std::function<std::vector<uint8_t>()>;

  explicit ChunkCache(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The chunk for `key`, produced by `load` on a miss. A chunk larger than the
  // whole cache is returned but not kept. A failed load is not cached: every
  // waiter gets the exception, and a later request tries again.
  Data get(const ChunkKey& key, const Loader& load);
  // Whether `key` is held or being loaded: a reader that fetches the raw
  // bytes of many chunks at once (a remote file) asks only for the others.
  bool contains(const ChunkKey& key) const;

  ChunkCacheStats stats() const;
  size_t capacity() const { return capacity_; }

 private:
  struct Pending {
    bool done = false;
    Data data;
    std::exception_ptr error;
  };
  // Recency is kept lazily: a hit only records a new stamp in its entry, and
  // eviction gives an entry whose stamp moved since it was queued a second
  // chance at the front (CLOCK-like). Moving the list node on every hit cost
  // more than the row copy itself when small rows are served from blocks.
  struct Node {
    ChunkKey key;
    uint64_t stamp;  // the entry's stamp when this node was queued
  };
  struct Entry {
    Data data;
    uint64_t stamp = 0;
  };
  size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable loaded_;
  std::unordered_map<ChunkKey, Entry, ChunkKeyHash> entries_;
  std::unordered_map<ChunkKey, std::shared_ptr<Pending>, ChunkKeyHash> pending_;
  std::list<Node> lru_;  // front: most recently queued
  uint64_t tick_ = 0;
  size_t bytes_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace chute::h5

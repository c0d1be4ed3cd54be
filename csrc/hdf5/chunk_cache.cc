#include "hdf5/chunk_cache.h"

namespace chute::h5 {

ChunkCache::Data ChunkCache::get(const ChunkKey& key, const Loader& load) {
  std::shared_ptr<Pending> pending;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      hits_ += 1;
      it->second.stamp = ++tick_;
      return it->second.data;
    }
    auto p = pending_.find(key);
    if (p != pending_.end()) {
      // Someone is decompressing it right now: share their result.
      std::shared_ptr<Pending> other = p->second;
      hits_ += 1;
      loaded_.wait(lock, [&] { return other->done; });
      if (other->error) std::rethrow_exception(other->error);
      return other->data;
    }
    misses_ += 1;
    pending = std::make_shared<Pending>();
    pending_.emplace(key, pending);
  }

  Data data;
  std::exception_ptr error;
  try {
    data = std::make_shared<const std::vector<uint8_t>>(load());
  } catch (...) {
    error = std::current_exception();
  }

  std::lock_guard<std::mutex> lock(mutex_);
  pending_.erase(key);
  pending->done = true;
  pending->data = data;
  pending->error = error;
  loaded_.notify_all();
  if (error) std::rethrow_exception(error);
  const size_t size = data->size();
  if (size <= capacity_ && size > 0) {
    const uint64_t stamp = ++tick_;
    lru_.push_front(Node{key, stamp});
    entries_.emplace(key, Entry{data, stamp});
    bytes_ += size;
    while (bytes_ > capacity_) {
      const Node victim = lru_.back();
      lru_.pop_back();
      auto v = entries_.find(victim.key);
      if (v->second.stamp != victim.stamp) {  // used since queued: second chance
        lru_.push_front(Node{victim.key, v->second.stamp});
        continue;
      }
      bytes_ -= v->second.data->size();
      entries_.erase(v);
      evictions_ += 1;
    }
  }
  return data;
}

bool ChunkCache::contains(const ChunkKey& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.count(key) > 0 || pending_.count(key) > 0;
}

ChunkCacheStats ChunkCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ChunkCacheStats s;
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  s.bytes = bytes_;
  s.capacity = capacity_;
  return s;
}

}  // namespace chute::h5

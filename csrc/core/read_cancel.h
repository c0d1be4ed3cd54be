// The stop flag of the reads a thread makes for an engine. An engine's
// worker threads install their engine's closing flag (ReadCancelScope), and
// a read that waits on a remote store (io/remote_ranges.h) gives up once it
// is set, so closing the engine ends a read that a stalled server holds
// rather than joining behind it for the store's whole retry budget. Sources
// shared by several engines are read by each engine's own threads: each
// read stops with the engine it was made for.
#pragma once

#include <atomic>

namespace chute {

// This thread's flag (null: none installed).
const std::atomic<bool>* current_read_cancel();

// Installs `flag` as this thread's for its lifetime (the previous one back after).
class ReadCancelScope {
 public:
  explicit ReadCancelScope(const std::atomic<bool>* flag);
  ~ReadCancelScope();
  ReadCancelScope(const ReadCancelScope&) = delete;
  ReadCancelScope& operator=(const ReadCancelScope&) = delete;

 private:
  const std::atomic<bool>* previous_;
};

}  // namespace chute

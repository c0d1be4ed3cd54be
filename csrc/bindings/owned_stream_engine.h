// How Python holds a stream engine: the engine (ProcessOwned: see
// process_owned.h) and the counters its byte sources share
// (SourceCounters), which its figures include.
#pragma once

#include <memory>
#include <utility>

#include "bindings/process_owned.h"
#include "engine/engine_stats.h"
#include "engine/stream_engine.h"
#include "io/byte_source.h"

namespace chute::bindings {

class OwnedStreamEngine : public ProcessOwned<StreamEngine> {
 public:
  OwnedStreamEngine(std::unique_ptr<StreamEngine> engine, std::shared_ptr<SourceCounters> counters)
      : ProcessOwned(std::move(engine)), counters_(std::move(counters)) {}

  // The engine's figures and its sources'; zeros in a forked copy.
  EngineStats stats() const {
    if (!here()) return EngineStats{};
    EngineStats s = get().stats();
    s.cache_corrupt_refetches = counters_->cache_corrupt_refetches.load();
    return s;
  }

 private:
  std::shared_ptr<SourceCounters> counters_;
};

}  // namespace chute::bindings

// Engines own threads. A process forked while one lives (torch's DataLoader
// forks its workers from a process that may hold a chute iterator) inherits
// the object but not its threads: there, closing or destroying it would join
// threads that do not exist and waiting on it would wait forever. Python
// holds each engine through ProcessOwned, which remembers the process that
// made it. In any other process the engine is never destroyed (its memory
// is the fork's copy, gone with the process), close() does nothing, its
// figures read as zeros and using it raises a usage error. In the process
// that made it, the engine is tracked until destroyed, so that interpreter
// exit closes it (engine_face.h, close_live_engines).
#pragma once

#include <unistd.h>

#include <memory>
#include <utility>

#include "bindings/engine_face.h"
#include "core/error.h"

namespace chute::bindings {

template <typename Engine>
class ProcessOwned {
 public:
  explicit ProcessOwned(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {
    track_engine(this, [this] { engine_->close(); });
  }
  ProcessOwned(const ProcessOwned&) = delete;
  ProcessOwned& operator=(const ProcessOwned&) = delete;
  ~ProcessOwned() {
    untrack_engine(this);
    if (!here()) (void)engine_.release();
  }

  bool here() const { return getpid() == owner_; }

  Engine& get() {
    CHUTE_CHECK(here(), kUsage,
                "this engine was made in process "
                    << owner_ << " and reached process " << getpid()
                    << " through fork(), without its threads: iterate the dataset anew here");
    return *engine_;
  }
  const Engine& get() const { return const_cast<ProcessOwned*>(this)->get(); }

 private:
  const pid_t owner_ = getpid();
  std::unique_ptr<Engine> engine_;
};

}  // namespace chute::bindings

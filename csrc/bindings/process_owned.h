// Engines own threads. A process forked while one lives (torch's DataLoader
// forks its workers from a process that may hold a chute iterator) inherits
// the object but not its threads: there, closing or destroying it would join
// threads that do not exist and waiting on it would wait forever. Python
// holds each engine through ProcessOwned, which remembers the process that
// made it. In any other process the engine is never destroyed (its memory
// is the fork's copy, gone with the process), close() does nothing, its
// figures read as zeros and using it raises a usage error. In the process
// that made it, the engine is tracked until destroyed, so that interpreter
// exit closes it (engine_face.h, close_live_engines). Closing or destroying
// it (with the GIL) then drops the Python objects its threads let go of
// (engine_face.h, keep_python_alive).
#pragma once

#include <unistd.h>

#include <exception>
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
    if (here()) {
      engine_.reset();
    } else {
      (void)engine_.release();
    }
    release_dropped_python_objects();
  }

  bool here() const { return getpid() == owner_; }

  // Stops the threads (with the GIL released: they may be waiting for a
  // Python thread that needs it); nothing in a forked copy.
  void close() {
    if (!here()) return;
    std::exception_ptr failure;  // rethrown once the GIL is back (ReleasedGil)
    {
      ReleasedGil released;
      try {
        engine_->close();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    release_dropped_python_objects();
    if (failure) std::rethrow_exception(failure);
  }

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

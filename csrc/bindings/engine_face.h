// What both engines look like to Python, written once:
//   next(timeout=0.0): the next batch (a Batch), or None when no batch will
//     come. The wait runs in short slices with the GIL released, and
//     Python's signal handlers run between them, so Ctrl-C interrupts it; a
//     timeout > 0 that passes first raises TimeoutError. A failed batch
//     raises its error at its position.
//   stats(): one dict, the same keys from either engine
//     (engine/engine_stats.h documents them).
// And what interpreter exit needs of them: every engine of the process is
// tracked (process_owned.h), and at exit, while the interpreter is still
// whole, close_live_engines stops all their threads. A daemon thread
// waiting on an engine then, or reaching one later, stops for good in the
// wait, as Python stops daemon threads; an engine that one makes after
// that is closed at once.
// And how native code holds Python objects: keep_python_alive, below.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "batching/batch.h"
#include "batching/ordered_results.h"
#include "engine/engine_stats.h"

namespace chute::bindings {

// Releases the GIL for its scope, as py::gil_scoped_release, for waits that
// a daemon thread may be in when the interpreter exits. Once Python
// finalizes, a thread that takes the GIL back is ended by pthread_exit,
// whose unwinding through a destructor (noexcept, as destructors are by
// default) is std::terminate: the process aborts. A thread other than the
// main one (which finalizes) that comes back once finalization has begun
// parks here instead, never to run again (the
// process is exiting; Python 3.14 parks such threads itself); one that
// finalization overtakes between that check and the GIL unwinds normally,
// which this destructor allows (noexcept(false)). Never let it end a scope
// that an exception is leaving: catch inside the scope, rethrow after it.
class ReleasedGil {
 public:
  ReleasedGil();
  ReleasedGil(const ReleasedGil&) = delete;
  ReleasedGil& operator=(const ReleasedGil&) = delete;
  ~ReleasedGil() noexcept(false);

 private:
  PyThreadState* state_;
};

// Runs `work` with the GIL released through ReleasedGil and returns its
// result; what it throws is rethrown once the GIL is back, since an
// exception must not leave a ReleasedGil scope.
template <typename Work>
auto without_gil(Work&& work) -> decltype(work()) {
  using Result = decltype(work());
  std::exception_ptr failure;
  if constexpr (std::is_void_v<Result>) {
    {
      ReleasedGil released;
      try {
        work();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
  } else {
    std::optional<Result> result;
    {
      ReleasedGil released;
      try {
        result.emplace(work());
      } catch (...) {
        failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
    return std::move(*result);
  }
}

// Adds an engine of this process (`key`: its owner) to those that
// close_live_engines stops; `close` closes it and joins its threads.
void track_engine(const void* key, std::function<void()> close);
void untrack_engine(const void* key);

// Closes every tracked engine, joining its threads (call without the GIL).
void close_live_engines();

// On a thread that exit left running (a daemon thread, after
// close_live_engines): parks it for good, what Python does to such a thread,
// rather than hand it the error of an engine closed under it. Otherwise
// returns at once. Call without the GIL.
void park_if_left_running_at_exit();

// A Python object owning memory that native code points into (a row
// group's buffers), alive while the returned owner is. Its last owner may go
// on an engine thread, which must never take the GIL: a thread holding it
// may be waiting for that engine thread (an engine's dealloc joins its
// threads with the GIL held). So a thread without the GIL only queues the
// reference, and release_dropped_python_objects, which every binding that
// holds the GIL and follows engine work calls (the engines' next() and
// close(), their dealloc, putting a block, exit), drops the queued ones.
std::shared_ptr<void> keep_python_alive(pybind11::object obj);

// Drops the Python references that native code let go of without the GIL
// (call with the GIL).
void release_dropped_python_objects();

// `next` is the engine's next(out, slice_seconds); called without the GIL.
pybind11::object wait_for_batch(const std::function<OrderedResults::Status(Batch*, double)>& next,
                                double timeout_s);

pybind11::dict stats_dict(const EngineStats& stats);

}  // namespace chute::bindings

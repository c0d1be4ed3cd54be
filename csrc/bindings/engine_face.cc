#include "bindings/engine_face.h"
#include "bindings/registry.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace chute::bindings {
namespace {

// How long one native wait lasts before Python's signal handlers get a turn.
constexpr double kWaitSliceS = 0.1;

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

struct LiveEngines {
  std::mutex mutex;
  std::unordered_map<const void*, std::function<void()>> closers;
};

// Never destroyed: engines may outlive static destruction. A forked child
// starts an empty list of its own (its engines are the parent's, which it
// must not close), and a fresh mutex, since another thread of the parent
// may have held the old one at the fork.
LiveEngines* live_engines = nullptr;

LiveEngines& live() {
  static std::once_flag once;
  std::call_once(once, [] {
    live_engines = new LiveEngines;
    pthread_atfork(nullptr, nullptr, [] { live_engines = new LiveEngines; });
  });
  return *live_engines;
}

// Set once the interpreter's exit has begun (_exit_begins, before the exit
// hooks stop the readers, or close_live_engines): a daemon thread whose
// wait a hook ends (its reads cancelled) parks rather than unwind into
// Python that would run on while the interpreter finalizes.
std::atomic<bool> exiting{false};
unsigned long main_thread_ident = 0;

bool on_main_thread() { return PyThread_get_thread_ident() == main_thread_ident; }

// Whether this thread is one that Python leaves running at exit (a daemon
// thread: by the time atexit runs, the others have been joined).
bool left_running_at_exit() { return exiting.load() && !on_main_thread(); }

// The Python ids of the threads parked for good, for exit to tell which
// threads have stopped (parked_threads). Never destroyed: parked threads
// outlive static destruction.
struct ParkedThreads {
  std::mutex mutex;
  std::vector<unsigned long> idents;
};
ParkedThreads* const parked = new ParkedThreads;

[[noreturn]] void park_forever() {
  {
    std::lock_guard<std::mutex> lock(parked->mutex);
    parked->idents.push_back(PyThread_get_thread_ident());
  }
  for (;;) pause();
}

// A Python reference that native code holds (keep_python_alive); once a
// thread without the GIL lets go of it, a node of dropped_references.
struct PythonReference {
  PyObject* object;
  PythonReference* next = nullptr;
};

// The references let go of without the GIL, newest first. A lock-free stack:
// a push (in a destructor, on an engine thread) neither blocks nor
// allocates, and a child forked meanwhile inherits a usable list (a mutex
// that another thread held at the fork would stay locked there; a push cut
// short by the fork only leaks its reference in the child).
std::atomic<PythonReference*> dropped_references{nullptr};

void drop_reference(void* p) {
  auto* reference = static_cast<PythonReference*>(p);
  // A thread that holds the GIL drops it at once. Once the interpreter is
  // gone, the queued reference is never dropped: leaking beats crashing.
  if (Py_IsInitialized() && PyGILState_Check()) {
    Py_DECREF(reference->object);
    delete reference;
    return;
  }
  reference->next = dropped_references.load(std::memory_order_relaxed);
  while (!dropped_references.compare_exchange_weak(reference->next, reference,
                                                   std::memory_order_release,
                                                   std::memory_order_relaxed)) {
  }
}

}  // namespace

std::shared_ptr<void> keep_python_alive(py::object obj) {
  release_dropped_python_objects();  // the GIL is held here anyway
  return std::shared_ptr<void>(new PythonReference{obj.release().ptr()}, drop_reference);
}

void release_dropped_python_objects() {
  // Taken whole: a reference dropped here may run Python code (a __del__)
  // that lets the GIL go, and another thread may empty the list meanwhile.
  PythonReference* reference = dropped_references.exchange(nullptr, std::memory_order_acquire);
  while (reference != nullptr) {
    PythonReference* next = reference->next;
    Py_DECREF(reference->object);
    delete reference;
    reference = next;
  }
}

ReleasedGil::ReleasedGil() : state_(PyEval_SaveThread()) {}

ReleasedGil::~ReleasedGil() noexcept(false) {
  // The main thread is the one finalizing: it keeps the GIL's use.
  if (interpreter_finalizing() && !on_main_thread()) park_forever();
  PyEval_RestoreThread(state_);
}

void park_if_left_running_at_exit() {
  if (left_running_at_exit()) park_forever();
}

void track_engine(const void* key, std::function<void()> close) {
  LiveEngines& engines = live();
  std::lock_guard<std::mutex> lock(engines.mutex);
  if (left_running_at_exit()) {
    close();
    return;
  }
  engines.closers.emplace(key, std::move(close));
}

void untrack_engine(const void* key) {
  LiveEngines& engines = live();
  std::lock_guard<std::mutex> lock(engines.mutex);
  engines.closers.erase(key);
}

void close_live_engines() {
  LiveEngines& engines = live();
  // Held throughout: an engine being destroyed meanwhile waits in
  // untrack_engine rather than vanish under its closer.
  std::lock_guard<std::mutex> lock(engines.mutex);
  exiting.store(true);
  for (auto& [key, close] : engines.closers) close();
  engines.closers.clear();
}

// Adds _close_live_engines to `m` and registers it with atexit.
void register_exit(py::module_& m) {
  main_thread_ident =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  m.def(
      "_close_live_engines",
      [] {
        {
          py::gil_scoped_release release;
          close_live_engines();
        }
        release_dropped_python_objects();
      },
      "Closes every engine of this process and joins its threads (run at exit).");
  py::module_::import("atexit").attr("register")(m.attr("_close_live_engines"));
  m.def(
      "_exit_begins", [] { exiting.store(true); },
      "Marks the interpreter as exiting: a thread other than the main one that comes back "
      "from an engine's wait parks (run at exit, before the hooks that cancel reads).");
  m.def(
      "_parked_threads",
      [] {
        std::vector<unsigned long> idents;
        {
          std::lock_guard<std::mutex> lock(parked->mutex);
          idents = parked->idents;
        }
        py::list out;
        for (unsigned long ident : idents) out.append(ident);
        return out;
      },
      "The ids (threading.get_ident()) of the threads that exit parked in a native wait.");
}

py::object wait_for_batch(const std::function<OrderedResults::Status(Batch*, double)>& next,
                          double timeout_s) {
  auto batch = std::make_unique<Batch>();
  OrderedResults::Status status;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    double slice = kWaitSliceS;
    if (timeout_s > 0) {
      const double left =
          timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (left <= 0) {
        std::ostringstream os;
        os << "no batch within " << timeout_s << " seconds";
        py::set_error(PyExc_TimeoutError, os.str().c_str());
        throw py::error_already_set();
      }
      slice = std::min(slice, left);
    }
    std::exception_ptr failure;
    {
      ReleasedGil released;
      try {
        status = next(batch.get(), slice);
      } catch (...) {
        failure = std::current_exception();
      }
      // Its engine was closed for exit: what Python does to a daemon
      // thread, stop it, rather than hand it a short epoch to act on.
      if (left_running_at_exit()) park_forever();
    }
    release_dropped_python_objects();
    if (failure) std::rethrow_exception(failure);
    if (status != OrderedResults::Status::kTimeout) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  if (status == OrderedResults::Status::kBatch) return py::cast(std::move(batch));
  return py::none();
}

py::dict stats_dict(const EngineStats& s) {
  py::dict d;
  d["batches"] = s.batches;
  d["samples_yielded"] = s.samples_yielded;
  d["bytes_yielded"] = s.bytes_yielded;
  d["batches_submitted"] = s.batches_submitted;
  d["queued_batches"] = s.queued_batches;
  d["samples_read"] = s.samples_read;
  d["samples_skipped"] = s.samples_skipped;
  d["samples_batched"] = s.samples_batched;
  d["samples_repeated"] = s.samples_repeated;
  d["shards_opened"] = s.shards_opened;
  d["encoded_bytes"] = s.encoded_bytes;
  d["read_seconds"] = static_cast<double>(s.read_ns) * 1e-9;
  d["decode_seconds"] = static_cast<double>(s.decode_ns) * 1e-9;
  d["transform_seconds"] = static_cast<double>(s.transform_ns) * 1e-9;
  d["decode_active_seconds"] = static_cast<double>(s.decode_active_ns) * 1e-9;
  d["decode_blocked_seconds"] = static_cast<double>(s.decode_blocked_ns) * 1e-9;
  d["decode_threads"] = s.decode_threads;
  d["prefetch_batches"] = s.prefetch_batches;
  d["ready_seen"] = s.ready_seen;
  d["consumer_waits"] = s.consumer_waits;
  d["shuffle_bytes"] = s.shuffle_bytes;
  d["shuffle_peak_bytes"] = s.shuffle_peak_bytes;
  d["shuffle_peak_samples"] = s.shuffle_peak_samples;
  d["cache_corrupt_refetches"] = s.cache_corrupt_refetches;
  d["arenas_created"] = s.memory.arenas_created;
  d["batch_bytes_reserved"] = s.memory.bytes_reserved;
  d["batch_bytes_in_use"] = s.memory.bytes_in_use;
  d["batch_peak_bytes_reserved"] = s.memory.peak_bytes_reserved;
  d["batch_peak_bytes_in_use"] = s.memory.peak_bytes_in_use;
  d["batch_bytes_pinned"] = s.memory.bytes_pinned;
  return d;
}

const BindingsFile kExitBindings{"_core", "exit", {}, register_exit};

}  // namespace chute::bindings

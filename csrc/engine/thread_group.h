// Owns a set of threads and joins them on destruction, so no engine can be
// destroyed with its workers still running. Callers must first close whatever
// the threads wait on.
#pragma once

#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#endif

namespace chute {

class ThreadGroup {
 public:
  ThreadGroup() = default;
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;
  ~ThreadGroup() { join(); }

  // `name` (at most 15 characters, the kernel's limit) is what top -H,
  // perf and py-spy show for the thread: "chute-decode" tells a user whose
  // CPU time it is.
  template <typename Fn>
  void spawn(const char* name, Fn&& fn) {
    threads_.emplace_back(named(name, std::forward<Fn>(fn)));
  }

  // Named twice, to the same name: by the new thread before `fn` runs, and
  // by the thread that starts it before this returns, so that code looking
  // for chute's threads by name right after an engine is made (the choice
  // between fork and forkserver for worker processes) finds them even when
  // the new thread has not run yet.
  template <typename Fn>
  static std::thread named(const char* name, Fn&& fn) {
    std::thread thread([name, fn = std::forward<Fn>(fn)]() mutable {
#if defined(__linux__)
      pthread_setname_np(pthread_self(), name);
#endif
      fn();
    });
#if defined(__linux__)
    pthread_setname_np(thread.native_handle(), name);
#endif
    return thread;
  }

  // Any thread but those of the group may call it, several at once (an
  // engine closed by its consumer and at interpreter exit): each returns
  // once all have ended.
  void join() {
    std::lock_guard<std::mutex> lock(join_mutex_);
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

  size_t size() const { return threads_.size(); }

 private:
  std::mutex join_mutex_;
  std::vector<std::thread> threads_;
};

}  // namespace chute

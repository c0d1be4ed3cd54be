#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "io/sources.h"
#include "io/unique_fd.h"

extern char** environ;

namespace chute {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kStderrTail = 4096;

// posix_spawn attribute/file-action objects need explicit destroy calls.
struct SpawnActions {
  posix_spawn_file_actions_t a;
  SpawnActions() { posix_spawn_file_actions_init(&a); }
  ~SpawnActions() { posix_spawn_file_actions_destroy(&a); }
  SpawnActions(const SpawnActions&) = delete;
  SpawnActions& operator=(const SpawnActions&) = delete;
};
struct SpawnAttr {
  posix_spawnattr_t a;
  SpawnAttr() { posix_spawnattr_init(&a); }
  ~SpawnAttr() { posix_spawnattr_destroy(&a); }
  SpawnAttr(const SpawnAttr&) = delete;
  SpawnAttr& operator=(const SpawnAttr&) = delete;
};

void make_pipe(UniqueFd& read_end, UniqueFd& write_end, const std::string& url) {
  int fds[2];
  const int rc = ::pipe2(fds, O_CLOEXEC);
  const int err = errno;
  CHUTE_CHECK(rc == 0, kIo, "cannot create a pipe for '" << url << "'" << OsFailure(err));
  read_end.reset(fds[0]);
  write_end.reset(fds[1]);
}

class PipeSource final : public ByteSource {
 public:
  PipeSource(std::string url, std::string command, double timeout_s,
             const std::atomic<bool>* cancel)
      : url_(std::move(url)), command_(std::move(command)), timeout_s_(timeout_s), cancel_(cancel) {
    UniqueFd out_w, err_w;
    make_pipe(out_, out_w, url_);
    make_pipe(err_, err_w, url_);

    SpawnActions actions;
    // dup2 onto 1 and 2 clears close-on-exec on the copies only; everything
    // else we own stays close-on-exec.
    posix_spawn_file_actions_addopen(&actions.a, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions.a, out_w.get(), 1);
    posix_spawn_file_actions_adddup2(&actions.a, err_w.get(), 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    // Descriptors another thread opened without O_CLOEXEC must not leak into
    // the child (a leaked pipe write end would hide EOF from someone else).
    posix_spawn_file_actions_addclosefrom_np(&actions.a, 3);
#endif

    SpawnAttr attr;
    sigset_t empty, defaults;
    sigemptyset(&empty);
    sigemptyset(&defaults);
    // Python ignores SIGPIPE and SIGXFSZ, and ignored dispositions survive
    // exec: restore them so a command whose reader went away dies quietly.
    sigaddset(&defaults, SIGPIPE);
    sigaddset(&defaults, SIGXFSZ);
    posix_spawnattr_setsigmask(&attr.a, &empty);
    posix_spawnattr_setsigdefault(&attr.a, &defaults);
    // Its own process group, so a timeout or an early close kills the whole
    // pipeline (`sh -c 'curl ... | gunzip'`), not just the shell.
    posix_spawnattr_setpgroup(&attr.a, 0);
    posix_spawnattr_setflags(&attr.a, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                          POSIX_SPAWN_SETSIGDEF);

    const char* argv[] = {"sh", "-c", command_.c_str(), nullptr};
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, "/bin/sh", &actions.a, &attr.a,
                                 const_cast<char* const*>(argv), environ);
    CHUTE_CHECK(rc == 0, kIo, "cannot start pipe command '" << command_ << "' for '" << url_
                                                            << "'" << OsFailure(rc, "/bin/sh"));
    pid_ = pid;
    // Our copies of the write ends must go, or we would never see EOF.
    out_w.reset();
    err_w.reset();
    set_nonblocking(out_.get());
    set_nonblocking(err_.get());
  }

  ~PipeSource() override { kill_and_reap(); }

  PipeSource(const PipeSource&) = delete;
  PipeSource& operator=(const PipeSource&) = delete;

  size_t read(uint8_t* dst, size_t n) override {
    if (finished_) return 0;
    CHUTE_CHECK(!failed_, kIo, "pipe source '" << url_ << "' was read after it failed");
    const Clock::time_point deadline = deadline_from_now();
    for (;;) {
      check_cancelled();
      pollfd fds[2] = {{out_.get(), POLLIN, 0}, {err_.get(), POLLIN, 0}};
      const int r = ::poll(fds, 2, poll_timeout_ms(deadline, cancel_cap_ms()));
      if (r < 0) {
        const int err = errno;
        if (err == EINTR) continue;
        fail_io("poll failed on pipe command '" + command_ + "'", err);
      }
      if (r == 0) {
        if (timeout_s_ > 0 && Clock::now() >= deadline) fail_timeout("produced no data");
        continue;
      }
      if (fds[1].revents != 0) drain_stderr();
      if (fds[0].revents != 0) {
        const ssize_t k = ::read(out_.get(), dst, n);
        if (k > 0) {
          offset_ += static_cast<uint64_t>(k);
          return static_cast<size_t>(k);
        }
        if (k == 0) {
          finish();
          return 0;
        }
        const int err = errno;
        if (err == EINTR || err == EAGAIN) continue;
        fail_io("read error on pipe command '" + command_ + "' at offset " +
                    std::to_string(offset_),
                err);
      }
    }
  }

  const std::string& url() const override { return url_; }

 private:
  static void set_nonblocking(int fd) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  }

  Clock::time_point deadline_from_now() const {
    if (timeout_s_ <= 0) return Clock::time_point::max();
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(timeout_s_));
  }

  // Without a cancel flag a wait may block for the whole timeout (or forever).
  int cancel_cap_ms() const { return cancel_ != nullptr ? kCancelPollMs : -1; }

  // The reader was closed while the command was silent: stop now rather than
  // hold the closing thread until the command speaks or exits.
  void check_cancelled() {
    if (cancel_ == nullptr || !cancel_->load(std::memory_order_relaxed)) return;
    kill_and_reap();
    failed_ = true;
    out_.reset();
    CHUTE_CHECK(false, kIo, "pipe command '" << command_ << "' for '" << url_
                                             << "' was stopped at offset " << offset_
                                             << ": its reader was closed");
  }

  int poll_timeout_ms(Clock::time_point deadline, int cap_ms = -1) const {
    if (timeout_s_ <= 0) return cap_ms;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    long ms = std::max<long>(0, static_cast<long>(left.count()) + 1);
    if (cap_ms >= 0) ms = std::min<long>(ms, cap_ms);
    return static_cast<int>(ms);
  }

  // Reads whatever stderr holds without blocking; keeps the last kStderrTail bytes.
  void drain_stderr() {
    char chunk[4096];
    while (err_.valid()) {
      const ssize_t k = ::read(err_.get(), chunk, sizeof chunk);
      if (k > 0) {
        stderr_tail_.append(chunk, static_cast<size_t>(k));
        if (stderr_tail_.size() > 2 * kStderrTail) {
          stderr_tail_.erase(0, stderr_tail_.size() - kStderrTail);
          stderr_truncated_ = true;
        }
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      // EOF or EAGAIN; any other error also means there is nothing more to get.
      if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) err_.reset();
      return;
    }
  }

  std::string stderr_text() const {
    std::string tail = stderr_tail_;
    if (tail.size() > kStderrTail) tail.erase(0, tail.size() - kStderrTail);
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ' || tail.back() == '\r')) {
      tail.pop_back();
    }
    if (tail.empty()) return "(no stderr output)";
    return (stderr_truncated_ || stderr_tail_.size() > kStderrTail ? "..." : "") + tail;
  }

  // stdout is at EOF: wait for the command to exit (still draining stderr so
  // it cannot block on a full pipe) and turn a failure into an error.
  void finish() {
    out_.reset();
    const Clock::time_point deadline = deadline_from_now();
    int status = 0;
    for (;;) {
      const pid_t w = ::waitpid(pid_, &status, WNOHANG);
      if (w == pid_) break;
      if (w < 0 && errno != EINTR) {
        const int err = errno;
        fail_io("waitpid failed for pipe command '" + command_ + "'", err);
      }
      if (timeout_s_ > 0 && Clock::now() >= deadline) {
        fail_timeout("closed its output but did not exit");
      }
      check_cancelled();
      // Polling with a short cap: the exit itself is not a pollable event.
      pollfd fd = {err_.get(), POLLIN, 0};
      (void)::poll(&fd, 1, poll_timeout_ms(deadline, 20));
      if (fd.revents != 0) drain_stderr();
    }
    reaped_ = true;
    drain_stderr();  // a grandchild may still hold stderr open: take what is there, do not wait
    err_.reset();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      finished_ = true;
      return;
    }
    std::string how = WIFEXITED(status)
                          ? "exited with status " + std::to_string(WEXITSTATUS(status))
                          : "was killed by signal " + std::to_string(WTERMSIG(status));
    fail_io("pipe command '" + command_ + "' " + how + " after " +
                             std::to_string(offset_) + " bytes: " + stderr_text());
  }

  [[noreturn]] void fail_timeout(const char* what) {
    kill_and_reap();
    drain_stderr();
    failed_ = true;
    CHUTE_CHECK(false, kTimeout, "pipe command '" << command_ << "' " << what << " for "
                                                  << timeout_s_ << " s (at offset " << offset_
                                                  << "); killed it: " << stderr_text());
    std::abort();  // not reached: keeps [[noreturn]] honest for the compiler
  }

  // `os_errno`: the errno of the failed call, 0 for a command that failed.
  [[noreturn]] void fail_io(const std::string& message, int os_errno = 0) {
    failed_ = true;
    out_.reset();
    CHUTE_CHECK(false, kIo, message << OsFailure(os_errno));
    std::abort();  // not reached: keeps [[noreturn]] honest for the compiler
  }

  void kill_and_reap() {
    if (pid_ <= 0 || reaped_) return;
    // The group id is the child's pid; it cannot be reused before we reap.
    (void)::kill(-pid_, SIGKILL);
    int status;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
  }

  std::string url_;
  std::string command_;
  double timeout_s_;
  const std::atomic<bool>* cancel_;
  UniqueFd out_;
  UniqueFd err_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  bool finished_ = false;
  bool failed_ = false;
  uint64_t offset_ = 0;
  std::string stderr_tail_;
  bool stderr_truncated_ = false;
};

}  // namespace

std::unique_ptr<ByteSource> open_pipe_source(const std::string& url, const std::string& command,
                                             double timeout_s, const std::atomic<bool>* cancel) {
  return std::make_unique<PipeSource>(url, command, timeout_s, cancel);
}

}  // namespace chute

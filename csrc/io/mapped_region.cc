#include "io/mapped_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace chute {

MappedRegion::MappedRegion(int fd, uint64_t offset, size_t size, const std::string& path) {
  if (size == 0) return;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  mapped_ = static_cast<size_t>(offset - start) + size;
  void* p = ::mmap(nullptr, mapped_, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  CHUTE_CHECK(p != MAP_FAILED, kIo,
              "cannot map " << size << " bytes at offset " << offset << " of '" << path
                            << "': " << std::strerror(errno));
  base_ = p;
  data_ = static_cast<const uint8_t*>(p) + (offset - start);
}

MappedRegion::~MappedRegion() {
  if (base_ != nullptr) ::munmap(base_, mapped_);
}

namespace {

// The copy in progress on this thread, if any. The thread sets it before the
// first copy, so the module's TLS block already exists when the handler reads
// it (__tls_get_addr then only looks it up; it allocates on a first access).
// initial-exec TLS would avoid the lookup, but a module loaded after torch
// finds no static TLS left for it.
thread_local sigjmp_buf* t_guard = nullptr;

struct sigaction g_previous;
std::once_flag g_installed;

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (t_guard != nullptr) siglongjmp(*t_guard, 1);
  // Not ours: do what would have happened without us.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler == SIG_IGN) return;
  if (g_previous.sa_handler == SIG_DFL) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_previous.sa_handler(sig);
}

void install_handler() {
  struct sigaction action {};
  action.sa_sigaction = on_sigbus;
  // SA_NODEFER: leaving the handler by siglongjmp then needs no signal mask
  // restore, so sigsetjmp(..., 0) (no syscall) is enough.
  action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGBUS, &action, &g_previous);
}

// Only trivially destructible locals between sigsetjmp and the copies: the
// jump back must not skip a destructor.
size_t guarded_copy(const CopySpan* spans, size_t count) {
  sigjmp_buf env;
  volatile size_t done = 0;
  if (sigsetjmp(env, 0) != 0) {
    t_guard = nullptr;
    return done;
  }
  t_guard = &env;
  // The handler must see the guard before the first load from the mapping,
  // and the loads must all be done before it is cleared.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  for (size_t i = 0; i < count; ++i) {
    std::memcpy(spans[i].dst, spans[i].src, spans[i].bytes);
    done = i + 1;
  }
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return count;
}

}  // namespace

size_t copy_from_mapping(const CopySpan* spans, size_t count) {
  std::call_once(g_installed, install_handler);
  return guarded_copy(spans, count);
}

}  // namespace chute

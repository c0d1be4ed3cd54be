#include "io/mapped_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
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

// Mapped files whose lost pages the handler replaces with zeros. The handler
// reads the table without a lock: a slot's `begin` is published last and
// cleared first, and a file leaves the table only when nothing reads it.
struct ZeroFillSlot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<std::atomic<bool>*> truncated{nullptr};
};
constexpr int kZeroFillSlots = 256;
ZeroFillSlot g_zero_fill[kZeroFillSlots];
std::mutex g_zero_fill_mutex;  // serialises claiming and freeing slots

struct sigaction g_previous;
std::once_flag g_installed;
uintptr_t g_page_size = 4096;  // set before the handler is installed

// Maps a zero page over the lost page at `addr` when it belongs to a
// registered file. mmap is not on POSIX's async-signal-safe list, but it is a
// plain system call with no user-space state, which is what that list guards.
bool zero_fill(uintptr_t addr) {
  for (ZeroFillSlot& slot : g_zero_fill) {
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    if (begin == 0 || addr < begin || addr >= slot.end.load(std::memory_order_relaxed)) continue;
    // Flag first: a thread that reads the zero page afterwards must find it set.
    slot.truncated.load(std::memory_order_relaxed)->store(true, std::memory_order_seq_cst);
    void* at = reinterpret_cast<void*>(addr / g_page_size * g_page_size);
    return ::mmap(at, g_page_size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED;
  }
  return false;
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (t_guard != nullptr) siglongjmp(*t_guard, 1);
  // The faulting load is retried on return and now reads zeros.
  if (zero_fill(reinterpret_cast<uintptr_t>(info->si_addr))) return;
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
  g_page_size = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
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

std::shared_ptr<MappedFile> MappedFile::map(int fd, uint64_t size) {
  if (size == 0 || size > SIZE_MAX) return nullptr;
  std::call_once(g_installed, install_handler);
  void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  // Sequential readahead for the faults, as for read().
  (void)::madvise(p, static_cast<size_t>(size), MADV_SEQUENTIAL);
  std::lock_guard<std::mutex> lock(g_zero_fill_mutex);
  for (int i = 0; i < kZeroFillSlots; ++i) {
    ZeroFillSlot& slot = g_zero_fill[i];
    if (slot.begin.load(std::memory_order_relaxed) != 0) continue;
    std::shared_ptr<MappedFile> file(new MappedFile(static_cast<uint8_t*>(p), size, i));
    slot.truncated.store(&file->truncated_, std::memory_order_relaxed);
    slot.end.store(reinterpret_cast<uintptr_t>(p) + size, std::memory_order_relaxed);
    slot.begin.store(reinterpret_cast<uintptr_t>(p), std::memory_order_release);
    return file;
  }
  ::munmap(p, static_cast<size_t>(size));
  return nullptr;
}

MappedFile::~MappedFile() {
  {
    std::lock_guard<std::mutex> lock(g_zero_fill_mutex);
    ZeroFillSlot& slot = g_zero_fill[slot_];
    slot.begin.store(0, std::memory_order_release);
    slot.end.store(0, std::memory_order_relaxed);
    slot.truncated.store(nullptr, std::memory_order_relaxed);
  }
  ::munmap(data_, static_cast<size_t>(size_));
}

void MappedFile::release(uint64_t begin, uint64_t end) const {
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t first = (begin + page - 1) / page * page;
  const uint64_t last = std::min(end, size_) / page * page;
  if (first >= last) return;
  (void)::madvise(data_ + first, static_cast<size_t>(last - first), MADV_DONTNEED);
}

}  // namespace chute

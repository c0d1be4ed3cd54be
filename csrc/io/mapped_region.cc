#include "io/mapped_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
  const int err = errno;
  CHUTE_CHECK(p != MAP_FAILED, kIo,
              "cannot map " << size << " bytes at offset " << offset << " of '" << path << "'"
                            << OsFailure(err, path));
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
// reads a slot without a lock, as a sequence lock: `seq` is odd while the
// slot is claimed or freed (under the mutex), and a read that saw it change
// is repeated. A slot being rewritten is skipped: no thread can fault in a
// file that is not yet mapped or no longer read.
struct ZeroFillSlot {
  std::atomic<uint32_t> seq{0};
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<std::atomic<uint64_t>*> valid_size{nullptr};
};
constexpr int kZeroFillSlots = 256;
ZeroFillSlot g_zero_fill[kZeroFillSlots];
std::mutex g_zero_fill_mutex;  // serialises the writers of the slots

void write_slot(ZeroFillSlot& slot, uintptr_t begin, uintptr_t end,
                std::atomic<uint64_t>* valid_size) {
  const uint32_t seq = slot.seq.load(std::memory_order_relaxed);
  slot.seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.begin.store(begin, std::memory_order_relaxed);
  slot.end.store(end, std::memory_order_relaxed);
  slot.valid_size.store(valid_size, std::memory_order_relaxed);
  slot.seq.store(seq + 2, std::memory_order_release);
}

// The handler that was installed before ours, called for faults that are not
// ours. Other code (faulthandler.enable(), a JVM, a debugger's agent) may
// install its own handler after ours; ensure_handler() then puts ours back
// and keeps theirs as the previous one. The handler reads the slot that
// g_previous_slot names; a writer fills the other slot, then flips it.
struct sigaction g_previous[2];
std::atomic<int> g_previous_slot{0};
std::mutex g_handler_mutex;  // serialises the writers of g_previous
const uintptr_t g_page_size = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));

void lower_to(std::atomic<uint64_t>& value, uint64_t bound) {
  uint64_t current = value.load(std::memory_order_relaxed);
  while (bound < current && !value.compare_exchange_weak(current, bound)) {
  }
}

// Maps a zero page over the lost page at `addr` when it belongs to a
// registered file, and lowers that file's valid size to the page. mmap is
// not on POSIX's async-signal-safe list, but it is a plain system call with
// no user-space state, which is what that list guards.
bool zero_fill(uintptr_t addr) {
  for (ZeroFillSlot& slot : g_zero_fill) {
    for (;;) {
      const uint32_t seq = slot.seq.load(std::memory_order_acquire);
      if ((seq & 1) != 0) break;
      const uintptr_t begin = slot.begin.load(std::memory_order_relaxed);
      const uintptr_t end = slot.end.load(std::memory_order_relaxed);
      std::atomic<uint64_t>* valid_size = slot.valid_size.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (slot.seq.load(std::memory_order_relaxed) != seq) continue;
      if (begin == 0 || addr < begin || addr >= end) break;
      const uintptr_t page = addr / g_page_size * g_page_size;
      // First: a thread that reads the zero page afterwards must see it.
      lower_to(*valid_size, page - begin);
      return ::mmap(reinterpret_cast<void*>(page), g_page_size, PROT_READ,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED;
    }
  }
  return false;
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (t_guard != nullptr) siglongjmp(*t_guard, 1);
  // A page past the end of a file that shrank (not a memory error): the
  // faulting load is retried on return and now reads zeros.
  if (info->si_code == BUS_ADRERR && zero_fill(reinterpret_cast<uintptr_t>(info->si_addr))) return;
  if (info->si_code <= 0 && info->si_pid == ::getpid()) {
    // Sent by this process to itself: a handler that ran before ours was
    // back in place passing a fault on (faulthandler reports a fault, puts
    // the previous handler, ours, back and raises). Returning lets the load
    // be retried; its fault then reaches us with its address.
    return;
  }
  // Not ours: do what would have happened without us.
  const struct sigaction& previous = g_previous[g_previous_slot.load(std::memory_order_acquire)];
  const bool with_info = (previous.sa_flags & SA_SIGINFO) != 0 && previous.sa_sigaction != nullptr;
  const bool is_default = !with_info && previous.sa_handler == SIG_DFL;
  const bool is_ignored = !with_info && previous.sa_handler == SIG_IGN;
  if (with_info) {
    previous.sa_sigaction(sig, info, context);
  } else if (!is_default && !is_ignored) {
    previous.sa_handler(sig);
  }
  if (info->si_code > 0) {
    // A real fault recurs when the load is retried on return: it takes the
    // default action then, rather than loop through handlers that return
    // (faulthandler's does, once it has reported). Ours comes back with the
    // next mapping or size check.
    ::signal(sig, SIG_DFL);
  } else if (is_default) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
}

struct sigaction our_action() {
  struct sigaction action {};
  action.sa_sigaction = on_sigbus;
  // SA_NODEFER: leaving the handler by siglongjmp then needs no signal mask
  // restore, so sigsetjmp(..., 0) (no syscall) is enough.
  action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  return action;
}

// Makes our handler the one the kernel calls, keeping whichever was there as
// the previous one. Called before every mapping is registered, every guarded
// copy and every size check, so that a handler installed after ours (e.g.
// faulthandler.enable()) leaves us unprotected for one piece of work at most.
// Costs one sigaction() call when ours is in place.
void ensure_handler() {
  struct sigaction current {};
  if (::sigaction(SIGBUS, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) != 0 &&
      current.sa_sigaction == on_sigbus) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_handler_mutex);
  const struct sigaction action = our_action();
  const int next = 1 - g_previous_slot.load(std::memory_order_relaxed);
  struct sigaction replaced {};
  if (::sigaction(SIGBUS, &action, &replaced) != 0) return;
  if ((replaced.sa_flags & SA_SIGINFO) != 0 && replaced.sa_sigaction == on_sigbus) return;
  g_previous[next] = replaced;
  g_previous_slot.store(next, std::memory_order_release);
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

bool guarded_read(void (*read)(void* context), void* context) {
  sigjmp_buf env;
  if (sigsetjmp(env, 0) != 0) {
    t_guard = nullptr;
    return false;
  }
  t_guard = &env;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  read(context);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return true;
}

}  // namespace

size_t copy_from_mapping(const CopySpan* spans, size_t count) {
  ensure_handler();
  return guarded_copy(spans, count);
}

bool read_from_mapping(void (*read)(void* context), void* context) {
  ensure_handler();
  return guarded_read(read, context);
}

std::shared_ptr<MappedFile> MappedFile::map(int fd, uint64_t size) {
  if (size == 0 || size > SIZE_MAX) return nullptr;
  // Our own descriptor: samples outlive the reader that opened the file, and
  // check_size() must still look at this file (not whatever the path names).
  UniqueFd own(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!own.valid()) return nullptr;
  ensure_handler();
  void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  // Sequential readahead for the faults, as for read().
  (void)::madvise(p, static_cast<size_t>(size), MADV_SEQUENTIAL);
  std::lock_guard<std::mutex> lock(g_zero_fill_mutex);
  for (int i = 0; i < kZeroFillSlots; ++i) {
    ZeroFillSlot& slot = g_zero_fill[i];
    if (slot.begin.load(std::memory_order_relaxed) != 0) continue;
    std::shared_ptr<MappedFile> file(
        new MappedFile(static_cast<uint8_t*>(p), size, i, std::move(own)));
    write_slot(slot, reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p) + size,
               &file->valid_size_);
    return file;
  }
  ::munmap(p, static_cast<size_t>(size));
  return nullptr;
}

MappedFile::MappedFile(uint8_t* data, uint64_t size, int slot, UniqueFd fd)
    : data_(data), size_(size), slot_(slot), fd_(std::move(fd)), valid_size_(size) {}

MappedFile::~MappedFile() {
  {
    std::lock_guard<std::mutex> lock(g_zero_fill_mutex);
    write_slot(g_zero_fill[slot_], 0, 0, nullptr);
  }
  ::munmap(data_, static_cast<size_t>(size_));
}

bool MappedFile::check_size() {
  ensure_handler();
  struct stat st {};
  // A file we cannot even stat any more is treated as gone.
  const uint64_t now = ::fstat(fd_.get(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  lower_to(valid_size_, now);
  return truncated();
}

void MappedFile::release(uint64_t begin, uint64_t end) const {
  const uint64_t page = g_page_size;
  const uint64_t first = (begin + page - 1) / page * page;
  const uint64_t last = std::min(end, size_) / page * page;
  if (first >= last) return;
  (void)::madvise(data_ + first, static_cast<size_t>(last - first), MADV_DONTNEED);
}

UniqueFd open_for_mapping(const std::string& path, uint64_t* size) {
  UniqueFd fd(open_cloexec(path, O_RDONLY));
  const int err = errno;
  CHUTE_CHECK(fd.valid(), kIo, "cannot open '" << path << "'" << OsFailure(err, path));
  struct stat st {};
  CHUTE_CHECK(::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode), kIo,
              "cannot map '" << path << "': not a regular file");
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

}  // namespace chute

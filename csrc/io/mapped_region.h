// Read-only views of files through mmap that survive the file shrinking
// underneath: a range with guarded copies out of it (HDF5 rows), and a whole
// file read in place (tar shards).
//
// Rows of contiguous HDF5 datasets are copied straight out of the page cache
// through a mapping: no syscall and no cache lookup per row, where small rows
// would pay a block cache's lock and hash and large ones pread's per-page
// lookups (benchmarks/README.md, "Measurements behind code choices"). Touching a
// mapped page past the end of a file that was truncated after mapping raises
// SIGBUS; copy_from_mapping reports it to the copying thread (how far it got)
// instead of killing the process.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "io/unique_fd.h"

namespace chute {

class MappedRegion {
 public:
  // Maps [offset, offset + size) of the open file `fd` (read-only, shared).
  // Throws kIo naming `path` when the kernel refuses.
  MappedRegion(int fd, uint64_t offset, size_t size, const std::string& path);
  ~MappedRegion();
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  // The byte at `offset` of the file.
  const uint8_t* data() const { return data_; }

 private:
  void* base_ = nullptr;  // page-aligned start of the mapping
  size_t mapped_ = 0;
  const uint8_t* data_ = nullptr;
};

struct CopySpan {
  uint8_t* dst;
  const uint8_t* src;  // inside a MappedRegion
  size_t bytes;
};

// Copies every span in order. Returns `count` when all were copied, or
// the index of the span whose source page no longer exists (SIGBUS).
//
// The SIGBUS handler is process-wide. It is installed on first use and put
// back whenever another handler replaced it (faulthandler.enable() does)
// before each guarded copy, mapping and size check; the replaced handler is
// kept and gets every signal that is not ours, so other code's handler still
// reports the faults it is there for. A handler installed in the middle of a
// read may see one fault of ours first: faulthandler then prints its report,
// hands the signal back, and the read goes on under ours (the process lives).
// A SIGBUS this process sends itself is taken as such a handing back and
// ignored.
size_t copy_from_mapping(const CopySpan* spans, size_t count);

// Runs `read(context)`, which reads from mappings (converting as it
// copies, say), under the same guard: false when it touched a page that no
// longer exists, instead of the process dying. It is then left midway, by
// siglongjmp: `read` must not throw, and its frames (and those of what it
// calls) may hold only trivially destructible objects.
bool read_from_mapping(void (*read)(void* context), void* context);

// A whole file mapped so that tar shards are parsed and decoded where they lie
// in the page cache: no copy into process memory and no page faults on fresh
// payload buffers (benchmarks/README.md, "Measurements behind code choices").
// If the file shrinks while mapped, pages past its new end read as zeros
// instead of raising SIGBUS (the kernel already zero-fills the rest of the
// page the new end falls in). A reader therefore checks, after reading, that
// the bytes it read lie below valid_size(), calling check_size() first.
class MappedFile {
 public:
  // nullptr when the kernel refuses the mapping or too many files are mapped
  // at once; the caller then reads the file instead.
  static std::shared_ptr<MappedFile> map(int fd, uint64_t size);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

  // Bytes [0, valid_size()) held the file's data when last checked: the
  // mapped size, lowered by a fault past the end and by check_size().
  uint64_t valid_size() const { return valid_size_.load(std::memory_order_acquire); }
  bool truncated() const { return valid_size() < size_; }
  // Looks at the file's size now (one fstat); returns truncated(). Bytes read
  // before this call and below the valid size after it were the file's.
  bool check_size();

  // Drops the pages that lie wholly inside [begin, end) from this process's
  // memory (RSS). They stay in the page cache; reading them again maps them.
  void release(uint64_t begin, uint64_t end) const;

 private:
  MappedFile(uint8_t* data, uint64_t size, int slot, UniqueFd fd);
  uint8_t* data_;
  uint64_t size_;
  int slot_;  // in the SIGBUS handler's table of zero-fill ranges
  UniqueFd fd_;
  std::atomic<uint64_t> valid_size_;
};

// Opens `path` read-only for mapping; its size at open goes to `*size`. An
// error (kIo) names the path when it cannot be opened or is not a regular file.
UniqueFd open_for_mapping(const std::string& path, uint64_t* size);

}  // namespace chute

// A read-only view of a file range through mmap, and copies out of it that
// survive the file shrinking underneath.
//
// Rows of contiguous HDF5 datasets are copied straight out of the page cache
// through a mapping: no syscall and no cache lookup per row (measured on 2
// cores: for 256-byte rows the lock and hash of a block cache cost more than
// the copy; for 63 KB rows pread's per-page lookups cost ~15%). Touching a
// mapped page past the end of a file that was truncated after mapping raises
// SIGBUS; copy_from_mapping reports it to the copying thread (how far it got)
// instead of killing the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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
// the index of the span whose source page no longer exists (SIGBUS). Installs
// a process-wide SIGBUS handler on first use; signals that do not come from
// inside this function go on to the handler that was there before.
size_t copy_from_mapping(const CopySpan* spans, size_t count);

}  // namespace chute

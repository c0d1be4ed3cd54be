// Member-level tar reader under SampleReader: walks headers (ustar with its
// prefix field, GNU `L`/`K` long names, PAX `x`/`g` records with `path` and
// `size`, base-256 numbers), verifies checksums, and hands out the payload of
// each regular file, GNU sparse files (old GNU `S` headers and PAX sparse
// formats 0.0, 0.1 and 1.0) expanded with their holes as tarfile reads them.
// Everything else (directories, links, devices, FIFOs) is skipped, as
// webdataset skips what tarfile does not call a regular file.
//
// Deliberately stricter than Python's tarfile (which webdataset uses): tarfile
// silently ends the archive at a bad checksum, a malformed PAX record or a
// partial header after the first member; here each is a kData error naming
// the url and offset, since silently dropping the rest of a shard is data loss.
// Those errors end the archive: past a header that cannot be trusted there is
// no telling where the next one starts. A member whose header is sound but
// whose payload cannot be read as a file (a malformed sparse map) is handed
// out with a `fault` instead, and the stream goes on after it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/byte_source.h"
#include "io/mapped_region.h"

namespace chute {

// One data region of a sparse file: `length` stored bytes that belong at
// `offset` of the file; the rest of the file is zeros.
struct SparseExtent {
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct TarMember {
  std::string name;             // after PAX/GNU long-name/prefix resolution
  uint64_t header_offset = 0;   // offset of the first header block (extension headers included)
  uint64_t data_offset = 0;     // offset of the stored bytes (after a sparse map)
  uint64_t size = 0;            // payload bytes as read (a sparse file's holes included)
  uint64_t stored_size = 0;     // bytes the archive holds from data_offset on
  bool sparse = false;
  std::vector<SparseExtent> extents;  // a sparse file's data regions, in order
  // Why the payload cannot be read, when it cannot; the stream moves past it.
  std::string fault;
};

// What the headers of one regular member say, extension headers included.
struct MemberHeaders {
  std::string name;           // resolved as TarStream resolves it
  uint64_t size = 0;
  uint64_t header_bytes = 0;  // from the first header block to the payload
};

// Parses the headers of the plain (not sparse) member that starts at `bytes`
// and ends before `bytes + n`: how the indexed reader checks that the bytes
// its index points at are the member it names. Throws kData naming `url`
// and the offset (that of bytes[0] is `offset`) where they are not.
MemberHeaders parse_member_headers(const uint8_t* bytes, size_t n, const std::string& url,
                                   uint64_t offset);

class TarStream {
 public:
  // With `in_place`, a source that can be mapped (a local file) is parsed
  // where it lies and its payloads are read with payload_in_place().
  explicit TarStream(std::unique_ptr<ByteSource> source, size_t buffer_bytes = size_t{1} << 20,
                     bool in_place = false);
  ~TarStream();
  TarStream(const TarStream&) = delete;
  TarStream& operator=(const TarStream&) = delete;

  // Moves to the next regular-file member, skipping any unread payload of the
  // current one. False at the end of the archive (a zero block, or EOF on a
  // block boundary); the rest of the source is then drained, so that a pipe's
  // exit status is checked and a cache entry completes.
  bool next(TarMember& member);

  // Appends the current member's payload to `dst` (a sparse file expanded).
  // The buffer grows only as bytes arrive (at most 64 MiB ahead of them), so
  // a corrupt size field cannot make us allocate what the stream does not
  // hold. Not for a member with a fault.
  void read_payload(std::vector<uint8_t>& dst);

  // The current member's payload inside mapping() (only when it is set, and
  // not for a sparse member, whose holes are not in the file).
  const uint8_t* payload_in_place();
  const std::shared_ptr<MappedFile>& mapping() const;

  const std::string& url() const;

  // After next() threw: whether the error came in the first header block of
  // a member (cut or corrupt), past the previous member's data and padding,
  // where Python's tarfile ends the archive quietly; not inside a member's
  // data or padding, nor in the headers after an extension header.
  bool failed_at_a_member_start() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chute

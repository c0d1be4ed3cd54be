// Member-level tar reader under SampleReader: walks headers (ustar with its
// prefix field, GNU `L`/`K` long names, PAX `x`/`g` records with `path` and
// `size`, base-256 numbers), verifies checksums, and hands out the payload of
// each regular file. Everything else (directories, links, devices) is skipped.
//
// Deliberately stricter than Python's tarfile (which webdataset uses): tarfile
// silently ends the archive at a bad checksum, a malformed PAX record or a
// partial header after the first member; here each is a kData error naming
// the url and offset, since silently dropping the rest of a shard is data loss.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/byte_source.h"
#include "io/mapped_region.h"

namespace chute {

struct TarMember {
  std::string name;             // after PAX/GNU long-name/prefix resolution
  uint64_t header_offset = 0;   // offset of the first header block (extension headers included)
  uint64_t data_offset = 0;     // offset of the payload
  uint64_t size = 0;            // payload bytes
};

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

  // Appends the current member's payload to `dst`. The buffer grows only as
  // bytes arrive (at most 64 MiB ahead of them), so a corrupt size field
  // cannot make us allocate what the stream does not hold.
  void read_payload(std::vector<uint8_t>& dst);

  // The current member's payload inside mapping() (only when it is set).
  const uint8_t* payload_in_place();
  const std::shared_ptr<MappedFile>& mapping() const;

  const std::string& url() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chute

// Reads a tar stream (ustar, GNU long names `L`/`K`, PAX `x`/`g` records) and
// groups consecutive members into samples by webdataset's key rule: the key
// is the member path up to the first dot of its basename, the extension the
// rest, lowercased. Directories, links and names without a dot in the
// basename are skipped. A repeated extension within one sample is a kData
// error naming the shard, member and offset.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/byte_source.h"
#include "io/mapped_region.h"

namespace chute {

struct SampleMember {
  std::string extension;    // lowercased, e.g. "jpg", "nsdgeneral.npy"
  std::string name;         // full member path, for error messages
  uint64_t header_offset;   // byte offset of the member's (first) header in the shard
  size_t data_begin;        // payload range inside EncodedSample::bytes()
  size_t data_size;
};

struct EncodedSample {
  std::string key;
  uint32_t source_index = 0;   // index of the shard in the engine's url list
  uint64_t offset = 0;         // byte offset of the sample's first header
  uint64_t end_offset = 0;     // byte offset just past the last payload
  std::vector<SampleMember> members;
  // The payloads: copied back to back into `data`, or, read in place, left
  // in the shard's mapping (data_begin is then the offset in the file).
  std::vector<uint8_t> data;
  std::shared_ptr<MappedFile> mapping;
  size_t payload_bytes = 0;

  const uint8_t* bytes() const { return mapping ? mapping->data() : data.data(); }
  // Read in place, and the shard now ends before this sample does: what was
  // read of it may be zeros (see MappedFile; call its check_size() first).
  bool lost() const { return mapping && end_offset > mapping->valid_size(); }
  const SampleMember* find(const std::string& extension) const;
  size_t encoded_bytes() const { return payload_bytes + key.size() + members.size() * 64; }
};

class SampleReader {
 public:
  // With `in_place`, samples of a local file point into its mapping instead
  // of holding copies (see MappedFile); other sources are copied as ever.
  SampleReader(std::unique_ptr<ByteSource> source, uint32_t source_index, bool in_place = false);
  ~SampleReader();
  SampleReader(const SampleReader&) = delete;
  SampleReader& operator=(const SampleReader&) = delete;

  // Fills `out` with the next sample; false at the end of the archive (two
  // zero blocks or a clean EOF on a block boundary). A truncated archive, a bad
  // header checksum or a non-tar file throws kData naming url and offset.
  bool next(EncodedSample& out);

  bool in_place() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chute

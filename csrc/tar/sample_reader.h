// Reads a tar stream (ustar, GNU long names `L`/`K`, PAX `x`/`g` records) and
// groups consecutive members into samples by webdataset's key rule: the key
// is the member path up to the first dot of its basename, the extension the
// rest, lowercased. Directories, links and names without a dot in the
// basename are skipped. A repeated extension within one sample is a kData
// error naming the shard, member and offset.
//
// Samples fill the pipeline's EncodedSample: offsets are byte offsets in the
// shard (a sample's and a member's first header; end_offset is just past the
// sample's last payload).
#pragma once

#include <cstdint>
#include <memory>

#include "io/byte_source.h"
#include "pipeline/encoded_sample.h"

namespace chute {

class SampleReader {
 public:
  // With `in_place`, samples of a local file point into its mapping (a
  // MappedShard, see tar/mapped_shard.h) instead of holding copies; other
  // sources are copied as ever.
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

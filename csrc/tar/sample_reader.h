// Reads a tar stream (ustar, GNU long names `L`/`K`, PAX `x`/`g` records,
// GNU sparse files) and groups consecutive members into samples by
// webdataset's key rule (tar/sample_key.h). Directories, links, devices and
// names without a dot in the basename are skipped.
//
// Faults lose no more than webdataset loses under a handler that goes on:
// - a member whose payload cannot be read (a malformed sparse map) makes its
//   sample bad: next() throws naming it, and the next call goes on after it;
// - a repeated extension within one sample leaves the repeat out: the sample
//   comes out flawed (EncodedSample::flawed) and the next call throws the
//   error naming shard, member and offset, then goes on;
// - a truncation or a corrupt header ends the archive; the members of the
//   sample read before it come out as a sample, flawed when the end cut one
//   of its members (not when it came in the headers after its last one),
//   and the next call throws the error, which counts one sample (a flawed
//   one, or, when nothing of it was read, the one it lost; what followed
//   the end cannot be counted).
//
// Samples fill the pipeline's EncodedSample: offsets are byte offsets in the
// shard (a sample's and a member's first header; end_offset is just past the
// sample's last payload).
#pragma once

#include <cstdint>
#include <memory>

#include "io/byte_source.h"
#include "sources/encoded_sample.h"
#include "sources/sample_source.h"

namespace chute {

class SampleReader {
 public:
  // With `in_place`, samples of a local file point into its mapping (a
  // MappedShard, see tar/mapped_shard.h) instead of holding copies; other
  // sources are copied as ever, and so is a sample with a sparse member.
  SampleReader(std::unique_ptr<ByteSource> source, uint32_t source_index, bool in_place = false);
  ~SampleReader();
  SampleReader(const SampleReader&) = delete;
  SampleReader& operator=(const SampleReader&) = delete;

  // Fills `out` with the next sample; false at the end of the archive (two
  // zero blocks or a clean EOF on a block boundary). Errors are kData naming
  // url and offset (see above for which ones the reader goes on after).
  bool next(EncodedSample& out);
  // After next() threw: whether the reader goes on after the error, and
  // what it cost (see SampleSource::failure).
  SampleSource::Failure failure() const;

  bool in_place() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chute

// Samples read by id rather than in order: what the indexed engine's sample
// mode decodes (tar shards with an index today; any format whose samples an
// index locates). The source knows each sample's members and sizes without
// reading them, and reads the samples of a batch together, so neighbouring
// samples cost one read.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/error.h"
#include "sources/encoded_sample.h"

namespace chute {

class IndexedSampleSource {
 public:
  virtual ~IndexedSampleSource() = default;

  virtual int64_t num_samples() const = 0;
  // Payload bytes of sample `id` (in range), from the index: nothing is read.
  virtual uint64_t payload_bytes(int64_t id) const = 0;

  // Reads samples ids[0..n) (all in range) into out[0..n); their payloads
  // lie in buffers shared with the neighbouring samples one read brought in
  // (EncodedSample::in_place). A sample whose bytes cannot be read gets
  // errors[i] (naming where it is) instead, out[i] still saying where it is
  // (key, source_index, offset). Called from several threads at once.
  virtual void read(const int64_t* ids, size_t n, EncodedSample* out,
                    std::optional<Error>* errors) const = 0;

  // Waits until samples ids[0..n) can be read (a source whose bytes its
  // owner delivers later: Parquet row groups being read), or `cancel` is
  // set (throws kIo then). Called before read(), from several threads at
  // once; a source that always can read returns at once.
  virtual void wait_readable(const int64_t* /*ids*/, size_t /*n*/,
                             const std::atomic<bool>& /*cancel*/) const {}

  // Where `sample` (or its `member`) is, for errors.
  virtual SampleLocation location(const EncodedSample& sample, const SampleMember* member) const = 0;
};

}  // namespace chute

// One sample as a source yields it, still encoded: its key and its members
// (extension → payload bytes). The payloads are either copied into the
// sample or left where the source found them (a mapped local shard), behind
// InPlaceStorage, which the engine asks after reading whether what it read
// was real and tells when the bytes are no longer needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace chute {

struct EncodedSample;

// Where a sample (or one of its members) lies, for an error about it: in
// words, for the message ("shard 'URL', member 'NAME' at offset N"), and as
// data, for the error's place (Error::scoped).
struct SampleLocation {
  std::string text;
  ErrorPlace place;
};

struct SampleMember {
  std::string extension;  // lowercased, e.g. "jpg", "nsdgeneral.npy"
  std::string name;       // full member name, for error messages
  uint64_t offset = 0;    // where the member starts in its source (a tar member's first header)
  // Where its payload starts in its source; kScattered when the payload is
  // not one range of it (a sparse file, whose holes are not stored).
  uint64_t data_offset = 0;
  static constexpr uint64_t kScattered = ~uint64_t{0};
  size_t data_begin = 0;  // payload range inside EncodedSample::bytes()
  size_t data_size = 0;
};

// Payload bytes that samples share in place instead of holding copies; kept
// alive by the samples that point into it, so it outlives the source that
// produced them. The bytes may stop being real underneath (a file cut while
// mapped): after reading a sample, the engine calls refresh() once and then
// lost() for each sample it read.
class InPlaceStorage {
 public:
  virtual ~InPlaceStorage() = default;
  InPlaceStorage(const InPlaceStorage&) = delete;
  InPlaceStorage& operator=(const InPlaceStorage&) = delete;

  const uint8_t* data() const { return data_; }

  // Looks at the underlying storage now (a system call); true when some of
  // it is gone.
  virtual bool refresh() const = 0;
  // Whether bytes of `sample` read before the last refresh() may not have
  // been its own.
  virtual bool lost(const EncodedSample& sample) const = 0;
  // The error that reports `sample` as lost.
  virtual Error lost_error(const EncodedSample& sample) const = 0;
  // No sample needs [begin, end) of the storage any more (source offsets):
  // it may leave the process's memory.
  virtual void release(uint64_t begin, uint64_t end) const = 0;

 protected:
  explicit InPlaceStorage(const uint8_t* data) : data_(data) {}

 private:
  const uint8_t* data_;
};

struct EncodedSample {
  std::string key;
  uint32_t source_index = 0;  // which of the plan's urls it came from
  uint64_t offset = 0;        // where the sample starts in its source
  uint64_t end_offset = 0;    // just past its last payload
  std::vector<SampleMember> members;
  // The values its source holds as null (a Parquet null: extension and name,
  // no payload), so that a field wanting one says it is null, not missing.
  std::vector<SampleMember> nulls;
  // The payloads, copied back to back into `data`, or, read in place, left
  // in `in_place` (data_begin is then an offset into its data()).
  std::vector<uint8_t> data;
  std::shared_ptr<const InPlaceStorage> in_place;
  size_t payload_bytes = 0;
  // The source found a fault that it left out of this sample (a repeated
  // extension, the members after a cut) and throws its error on the next
  // call. Under the skip policy the sample is delivered as read, as
  // webdataset delivers it; under raise the error comes instead.
  bool flawed = false;

  const uint8_t* bytes() const { return in_place ? in_place->data() : data.data(); }
  const SampleMember* find(const std::string& extension) const {
    for (const SampleMember& m : members) {
      if (m.extension == extension) return &m;
    }
    return nullptr;
  }
  // The sample's size as a shuffle buffer counts it: a function of what a
  // tar index records (payloads, key, a fixed cost per member), so that an
  // elastic resume can replay the buffer from the indexes alone
  // (wds/elastic_stream.py). Payload buffers are trimmed to fit before a sample
  // enters a buffer (to at most about twice the payload), so the bound
  // holds within that factor of held_bytes().
  size_t encoded_bytes() const { return payload_bytes + key.size() + members.size() * 64; }
  // The memory holding the sample costs: its payload buffer as allocated
  // (a reused buffer may be larger than the payload), or the payload's
  // bytes of the storage it points into, and its bookkeeping. What the
  // engine's byte bounds (chunks, shuffle buffers, batches in flight) count.
  size_t held_bytes() const {
    size_t bytes = sizeof(EncodedSample) + key.capacity() +
                   (members.capacity() + nulls.capacity()) * sizeof(SampleMember) +
                   (in_place ? payload_bytes : data.capacity());
    for (const SampleMember& m : members) bytes += m.extension.capacity() + m.name.capacity();
    return bytes;
  }
};

}  // namespace chute

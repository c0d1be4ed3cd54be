// How the stream engine decodes a field without knowing its codec: a field
// decoder reads a member's header (probe: the row's dtype and shape, checked
// before the sample joins a batch) and later decodes the member into its row
// of the batch memory. Decoders are shared by all threads, so both calls are
// const and keep per-call state on the stack or per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/random.h"

namespace chute {

// What probing one field of one sample found.
struct ProbedField {
  int member = -1;  // index into EncodedSample::members; -1 when absent
  DType dtype = DType::kU8;     // of the row
  std::vector<int64_t> shape;   // of the row (empty for a scalar)
  // numpy's name for an element type that DType has no name for (an .npy
  // descr such as "'<c8'"): the row is then uint8 bytes whose last axis is
  // one element, and the consumer views them as that type (Tensor::descr).
  std::string descr;
  // What the decoder learnt from the header and needs again to decode, in
  // its own terms (an image's decoded height and width, an .npy payload's
  // offset and flags, a label's value).
  int64_t detail[2] = {0, 0};
};

// Where a row sits in the epoch. A decoder that draws random numbers (a
// random crop, a flip) seeds them from this, so they depend on the plan and
// never on which thread decodes the row.
struct RowPosition {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t batch = 0;  // position in the epoch, counting skipped (resumed) batches
  size_t row = 0;
  size_t field = 0;

  uint64_t derive() const {
    return derive_seed({seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(batch), row,
                        field});
  }
};

class FieldDecoder {
 public:
  virtual ~FieldDecoder() = default;
  // Reads the header of a member's payload into out.dtype, out.shape and
  // out.detail. Throws kData for bytes it cannot decode (the engine adds
  // where they are).
  virtual void probe(const uint8_t* data, size_t size, ProbedField& out) const = 0;
  // Decodes the payload probed as `probed` into `out`, which holds one row
  // of probed.dtype and probed.shape.
  virtual void decode(const uint8_t* data, size_t size, const ProbedField& probed,
                      const RowPosition& at, uint8_t* out) const = 0;
};

}  // namespace chute

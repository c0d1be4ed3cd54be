// The fields of a SampleDecoding applied to samples: which member feeds each field, what
// the field's decoder makes of the member's header, whether two samples can
// share a stacked batch, and where a sample is when an error must say so.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "batching/sample_decoding.h"
#include "core/error.h"
#include "sources/encoded_sample.h"
#include "sources/field_decoder.h"

namespace chute {

struct PlannedSample {
  EncodedSample encoded;
  std::vector<ProbedField> fields;  // one per field of the plan
};

class SampleFields {
 public:
  // `decoding` outlives this object.
  explicit SampleFields(const SampleDecoding& decoding) : decoding_(decoding) {}

  // Finds each field's member and probes it. Throws kData naming the sample
  // when a required field is missing or a header is bad.
  void probe(PlannedSample& sample) const;

  // Nothing when `other` fits a batch that `first` started (every stacked
  // field has the same dtype and shape), else the kData error naming it.
  std::optional<Error> incompatibility(const PlannedSample& first,
                                       const PlannedSample& other) const;

  // Bytes the sample's row takes in a batch once decoded (raw fields are
  // copied as they are), from what probe() found.
  size_t decoded_bytes(const PlannedSample& sample) const;

  // Where `sample` (or its `member`) is, as the source describes it.
  SampleLocation location(const EncodedSample& sample, const SampleMember* member) const;

  // Runs fn, which decodes `member` of `sample`. A chute::Error from it is
  // rethrown with the location in front, keeping its kind and the place it
  // was raised, scoped as a member that does not decode (ErrorScope::kMember,
  // the location's url, member and key as its place); a
  // sample read in place whose bytes were lost meanwhile fails as such,
  // whatever fn made of them. The location is built only on failure:
  // formatting it for every sample would cost more than decoding a small one.
  template <typename Fn>
  void with_context(const EncodedSample& sample, const SampleMember* member, Fn&& fn) const {
    try {
      fn();
    } catch (const Error& e) {
      throw in_context(e, sample, member);
    }
  }
  Error in_context(const Error& error, const EncodedSample& sample,
                   const SampleMember* member) const;

 private:
  const SampleDecoding& decoding_;
};

}  // namespace chute

// How encoded samples become the columns of a batch, whichever engine read
// them: the output fields (which member feeds each, which decoder decodes
// it), what else a batch carries, the error policy, and where a sample is
// when an error must name it. The stream engine derives it from its plan;
// the indexed engine's sample mode takes it from its own.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sources/encoded_sample.h"
#include "sources/field_decoder.h"

namespace chute {

enum class ErrorPolicy : uint8_t { kRaise, kSkip };

struct FieldPlan {
  std::string name;                     // for messages
  std::vector<std::string> extensions;  // alternatives; the first present wins
  // Null: the member's bytes are handed over undecoded (Python decodes them).
  std::shared_ptr<const FieldDecoder> decoder;
  bool optional = false;  // absent member → row marked absent (dict samples), else an error
  bool stack = true;      // one [B, ...] tensor; false → one tensor per sample
};

struct SampleDecoding {
  std::vector<FieldPlan> fields;
  // Members whose extension no field claims are returned raw per sample
  // (dict-style samples keep every member).
  bool keep_other_members = false;
  bool collect_keys = true;  // Batch::keys filled
  uint64_t seed = 0;         // of the decoders' random draws (RowPosition)
  ErrorPolicy on_error = ErrorPolicy::kRaise;
  // Where `sample` (or its `member`, when not null) is, for errors: "shard
  // 'URL', member 'NAME' at offset N", and its url, member and key. Called
  // only on failure.
  std::function<SampleLocation(const EncodedSample& sample, const SampleMember* member)> locate;
};

}  // namespace chute

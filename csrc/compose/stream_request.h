// A stream engine's plan as Python describes it: the generic settings, how
// to reach the urls (io's SourceOptions) and each field's codec spec.
// compose_stream_plan() picks the source and the decoders (catalog.h) and
// returns the plan the engine runs.
#pragma once

#include <vector>

#include "decode/field_spec.h"
#include "io/byte_source.h"
#include "pipeline/stream_plan.h"

namespace chute {

struct FieldRequest {
  FieldPlan field;        // field.decoder is made from `codec`
  FieldCodecSpec codec;
};

struct StreamRequest {
  StreamPlan plan;        // plan.sources and plan.fields are made from the rest
  SourceOptions source;
  // Set: the factory that reads the urls (one that Python feeds, such as
  // pipeline/block_feed.h), instead of the catalog's choice.
  std::shared_ptr<const SampleSourceFactory> sources;
  std::vector<FieldRequest> fields;
};

StreamPlan compose_stream_plan(const StreamRequest& request);

}  // namespace chute

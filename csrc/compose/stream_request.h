// A stream engine's plan as Python describes it: the generic settings, how
// to reach the urls (io's SourceOptions) and each field's codec spec.
// compose_stream_plan() picks the source and the decoders (catalog.h) and
// returns the plan the engine runs. A stream's source is chosen by who
// brings its samples: Python feeds the formats it reads itself (Parquet and
// Arrow row groups, into sources/block_feed.h) and sets `sources`; every
// other url list is tar's, through io/'s byte sources (local files, `pipe:`
// commands), which refuse what they cannot open.
#pragma once

#include <vector>

#include "decode/field_spec.h"
#include "engine/stream_plan.h"
#include "io/byte_source.h"

namespace chute {

struct FieldRequest {
  FieldPlan field;        // field.decoder is made from `codec`
  FieldCodecSpec codec;
};

struct StreamRequest {
  StreamPlan plan;        // plan.sources and plan.fields are made from the rest
  SourceOptions source;
  // Set: the factory that reads the urls (one that Python feeds, such as
  // sources/block_feed.h); unset: tar's.
  std::shared_ptr<const SampleSourceFactory> sources;
  std::vector<FieldRequest> fields;
};

StreamPlan compose_stream_plan(const StreamRequest& request);

}  // namespace chute

// The one place that knows which sample source reads a url and which field
// decoder a field spec asks for. A new source (an object store, an indexed
// tar shard) or a new codec is a file pair in its own folder plus one line
// in a table of catalog.cc; the engines never change.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "decode/field_spec.h"
#include "io/byte_source.h"
#include "pipeline/field_decoder.h"
#include "pipeline/sample_source.h"

namespace chute {

// The source factory that reads every one of `urls`. Throws kUsage when no
// registered source reads them all.
std::shared_ptr<const SampleSourceFactory> sample_sources_for(const std::vector<std::string>& urls,
                                                              const SourceOptions& options);

// The decoder for `spec`, or null for FieldCodec::kRaw (the engine hands the
// bytes over undecoded). Throws kUsage naming `field` for a spec that cannot
// work.
std::shared_ptr<const FieldDecoder> field_decoder_for(const FieldCodecSpec& spec,
                                                      const std::string& field);

}  // namespace chute

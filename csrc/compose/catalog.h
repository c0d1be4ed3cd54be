// The one place that knows which reader opens an indexed tar shard and which
// field decoder a field spec asks for. A new codec is a file pair in its own
// folder plus one line in a table of catalog.cc; a new way to reach indexed
// tar shards is one line too; the engines never change. indexed_request.h
// builds the index-driven sources (through these tables where they have a
// choice); stream_request.h says which source a stream reads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "decode/field_spec.h"
#include "io/byte_source.h"
#include "io/range_reader.h"
#include "sources/field_decoder.h"
#include "tar/tar_index.h"

namespace chute {

class FetchQueue;

// The reader of one shard of a tar index: a remote url through `remote`'s
// ranged requests when a queue is given, else a local file (a remote url
// without a queue then fails to open, naming the shard). Throws as the
// reader does when the shard is not the one `shard.identity` describes.
std::unique_ptr<RangeReader> shard_reader_for(const TarIndex::Shard& shard,
                                              const std::shared_ptr<FetchQueue>& remote);

// The decoder for `spec`, or null for FieldCodec::kRaw (the engine hands the
// bytes over undecoded). Throws kUsage naming `field` for a spec that cannot
// work.
std::shared_ptr<const FieldDecoder> field_decoder_for(const FieldCodecSpec& spec,
                                                      const std::string& field);

}  // namespace chute

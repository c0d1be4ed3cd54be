#include "compose/catalog.h"

#include "core/error.h"
#include "decode/image_field.h"
#include "decode/label_field.h"
#include "decode/npy_field.h"
#include "io/remote_ranges.h"
#include "io/remote_source.h"

namespace chute {
namespace {

struct ShardReaderEntry {
  bool (*reads)(const TarIndex::Shard& shard, const std::shared_ptr<FetchQueue>& remote);
  std::unique_ptr<RangeReader> (*open)(const TarIndex::Shard& shard,
                                       const std::shared_ptr<FetchQueue>& remote);
};

// First match wins; local files take every shard no entry before them claims.
const ShardReaderEntry kShardReaders[] = {
    // remote objects, by ranged requests through chute.remote's queue
    {[](const TarIndex::Shard& s, const std::shared_ptr<FetchQueue>& remote) {
       return remote != nullptr && is_remote_url(s.path);
     },
     [](const TarIndex::Shard& s, const std::shared_ptr<FetchQueue>& remote) {
       return open_remote_range_reader(s.path, remote, s.identity);
     }},
    // local files, by pread
    {[](const TarIndex::Shard&, const std::shared_ptr<FetchQueue>&) { return true; },
     [](const TarIndex::Shard& s, const std::shared_ptr<FetchQueue>&) {
       return open_local_range_reader(s.url, s.path, s.identity);
     }},
};

struct DecoderEntry {
  FieldCodec codec;
  std::shared_ptr<const FieldDecoder> (*make)(const FieldCodecSpec& spec, const std::string& field);
};

const DecoderEntry kDecoders[] = {
    {FieldCodec::kImage,
     [](const FieldCodecSpec& s, const std::string& field) -> std::shared_ptr<const FieldDecoder> {
       return std::make_shared<ImageFieldDecoder>(s.color, s.image, field);
     }},
    {FieldCodec::kNpy,
     [](const FieldCodecSpec&, const std::string&) -> std::shared_ptr<const FieldDecoder> {
       return std::make_shared<NpyFieldDecoder>();
     }},
    {FieldCodec::kInt,
     [](const FieldCodecSpec&, const std::string&) -> std::shared_ptr<const FieldDecoder> {
       return std::make_shared<LabelFieldDecoder>();
     }},
};

}  // namespace

std::unique_ptr<RangeReader> shard_reader_for(const TarIndex::Shard& shard,
                                              const std::shared_ptr<FetchQueue>& remote) {
  for (const ShardReaderEntry& entry : kShardReaders) {
    if (entry.reads(shard, remote)) return entry.open(shard, remote);
  }
  CHUTE_CHECK(false, kUsage, "no reader opens tar shard '" << shard.url << "'");
  return nullptr;
}

std::shared_ptr<const FieldDecoder> field_decoder_for(const FieldCodecSpec& spec,
                                                      const std::string& field) {
  if (spec.codec == FieldCodec::kRaw) return nullptr;
  for (const DecoderEntry& entry : kDecoders) {
    if (entry.codec == spec.codec) return entry.make(spec, field);
  }
  CHUTE_CHECK(false, kUsage, "field '" << field << "': no decoder for codec "
                                       << static_cast<int>(spec.codec));
  return nullptr;
}

}  // namespace chute

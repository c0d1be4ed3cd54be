#include "tar/tar_index.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "tar/sample_reader.h"

namespace chute {

size_t TarIndex::shard_of(int64_t id) const {
  // The last shard whose first sample is at or before `id` (empty shards share it).
  const int64_t* begin = shard_starts.data;
  const int64_t* end = shard_starts.data + shard_starts.size;
  return static_cast<size_t>(std::upper_bound(begin, end, id) - begin) - 1;
}

void TarIndex::validate() const {
  const size_t n = sample_offsets.size;
  const size_t m = member_offsets.size;
  CHUTE_CHECK(shard_starts.size == shards.size() + 1, kUsage,
              "tar index: " << shard_starts.size << " shard starts for " << shards.size()
                            << " shards");
  CHUTE_CHECK(key_starts.size == n + 1 && member_starts.size == n + 1, kUsage,
              "tar index: key and member starts must have one entry per sample and one more");
  CHUTE_CHECK(member_extensions.size == m && member_sizes.size == m &&
                  member_header_offsets.size == m,
              kUsage,
              "tar index: member columns of different lengths");
  CHUTE_CHECK(shard_starts[0] == 0 && static_cast<size_t>(shard_starts[shards.size()]) == n,
              kUsage, "tar index: shard starts must run from 0 to the sample count " << n);
  CHUTE_CHECK(key_starts[0] == 0 && static_cast<size_t>(key_starts[n]) == keys.size &&
                  member_starts[0] == 0 && static_cast<size_t>(member_starts[n]) == m,
              kUsage, "tar index: key or member starts do not cover their columns");
  for (size_t s = 0; s < shards.size(); ++s) {
    CHUTE_CHECK(shard_starts[s] <= shard_starts[s + 1], kUsage,
                "tar index: shard starts decrease at shard '" << shards[s].url << "'");
  }
  for (size_t i = 0; i < n; ++i) {
    CHUTE_CHECK(key_starts[i] <= key_starts[i + 1], kUsage, "tar index: key starts decrease");
    CHUTE_CHECK(member_starts[i] < member_starts[i + 1], kUsage,
                "tar index: sample " << i << " has no members");
    CHUTE_CHECK(sample_offsets[i] >= 0, kUsage, "tar index: sample " << i << " has a negative offset");
  }
  for (size_t i = 0; i < n; ++i) {
    for (auto j = static_cast<size_t>(member_starts[i]); j < static_cast<size_t>(member_starts[i + 1]); ++j) {
      // At least one 512-byte header block before every payload.
      CHUTE_CHECK(member_header_offsets[j] >= sample_offsets[i] && member_offsets[j] >= 512 &&
                      member_header_offsets[j] <= member_offsets[j] - 512,
                  kUsage,
                  "tar index: sample " << i << " has a member whose headers at "
                                       << member_header_offsets[j]
                                       << " do not lie between the sample's offset "
                                       << sample_offsets[i] << " and its payload at "
                                       << member_offsets[j]);
    }
  }
  for (size_t j = 0; j < m; ++j) {
    CHUTE_CHECK(member_extensions[j] >= 0 &&
                    static_cast<size_t>(member_extensions[j]) < extensions.size(),
                kUsage, "tar index: member " << j << " has an unknown extension");
    CHUTE_CHECK(member_offsets[j] >= 0 && member_sizes[j] >= 0, kUsage,
                "tar index: member " << j << " has a negative offset or size");
  }
  // Every payload inside its shard, as far as the shard's size is known.
  for (size_t s = 0; s < shards.size(); ++s) {
    const int64_t size = shards[s].identity.size;
    if (size < 0) continue;
    for (auto i = static_cast<size_t>(shard_starts[s]); i < static_cast<size_t>(shard_starts[s + 1]); ++i) {
      for (auto j = static_cast<size_t>(member_starts[i]); j < static_cast<size_t>(member_starts[i + 1]); ++j) {
        CHUTE_CHECK(member_offsets[j] <= size && member_sizes[j] <= size - member_offsets[j], kUsage,
                    "tar index: shard '" << shards[s].url << "' of " << size << " bytes: sample "
                                         << i << " has a member at [" << member_offsets[j] << ", "
                                         << member_offsets[j] + member_sizes[j] << ")");
      }
    }
  }
}

namespace {

constexpr uint64_t kDigestStart = 14695981039346656037ull;

uint64_t add_to_digest(uint64_t digest, const uint8_t* bytes, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    digest = (digest ^ word) * 1099511628211ull;
  }
  for (; i < n; ++i) digest = (digest ^ bytes[i]) * 1099511628211ull;
  return digest;
}

}  // namespace

std::vector<ScannedSample> scan_tar_index(std::unique_ptr<ByteSource> source,
                                          std::optional<uint64_t>* digest) {
  // In place where the source maps (a local file): headers are parsed where
  // they lie and payloads are never copied.
  const std::string reader_url = source->url();
  SampleReader reader(std::move(source), 0, /*in_place=*/true);
  std::vector<ScannedSample> samples;
  uint64_t in_place_digest = kDigestStart;
  bool hashed_in_place = reader.in_place();
  EncodedSample sample;
  while (reader.next(sample)) {
    ScannedSample s;
    s.key = sample.key;
    s.offset = sample.offset;
    s.members.reserve(sample.members.size());
    for (const SampleMember& m : sample.members) {
      if (m.data_offset == SampleMember::kScattered) {
        std::ostringstream os;
        os << "tar archive '" << reader_url << "': member '" << m.name << "' at offset " << m.offset
           << " is a sparse file, whose payload is not one range of the shard: the shard "
              "cannot be indexed";
        throw Error(ErrorKind::kData, os.str(), __FILE__, __LINE__, ErrorScope::kRead,
                    {reader_url, m.name, sample.key});
      }
      s.members.push_back({m.extension, m.offset, m.data_offset, m.data_size});
      if (sample.in_place) {
        in_place_digest = add_to_digest(in_place_digest, sample.in_place->data() + m.offset,
                                        static_cast<size_t>(m.data_offset - m.offset));
      } else {
        hashed_in_place = false;
      }
    }
    samples.push_back(std::move(s));
  }
  if (digest != nullptr) {
    if (hashed_in_place) {
      *digest = in_place_digest;
    } else {
      digest->reset();
    }
  }
  return samples;
}

uint64_t header_digest(const std::vector<ScannedSample>& samples, const RangeReader& shard) {
  // Every member's headers in one read_spans call (one round trip for a
  // remote shard), then hashed member by member.
  std::vector<RangeReader::Span> spans;
  size_t total = 0;
  for (const ScannedSample& s : samples) {
    for (const ScannedMember& m : s.members) {
      CHUTE_CHECK(m.header_offset <= m.offset, kUsage,
                  "tar index of '" << shard.url() << "': a member's headers at "
                                   << m.header_offset << " lie after its payload at " << m.offset);
      spans.push_back({m.header_offset, static_cast<size_t>(m.offset - m.header_offset), nullptr});
      total += spans.back().size;
    }
  }
  std::vector<uint8_t> headers(total);
  size_t at = 0;
  for (RangeReader::Span& span : spans) {
    span.dst = headers.data() + at;
    at += span.size;
  }
  shard.read_spans(spans.data(), spans.size());
  uint64_t digest = kDigestStart;
  for (const RangeReader::Span& span : spans) {
    digest = add_to_digest(digest, span.dst, span.size);
  }
  return digest;
}

}  // namespace chute

// The sample index of a set of tar shards, as compact columns: per sample
// its shard, key, first header offset and members; per member its extension
// and where its payload lies in the shard. Python reads the sidecar index
// files (python/chute/sources/tarindex.py) into these columns and the bindings hand
// them over without a copy; scan_tar_index() is what builds an index's
// content, grouping members with the reader's key rule (tar/sample_reader.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/byte_source.h"
#include "io/range_reader.h"

namespace chute {

// A read-only view of n values that someone else owns (TarIndex::owner).
template <typename T>
struct IndexColumn {
  const T* data = nullptr;
  size_t size = 0;
  const T& operator[](size_t i) const { return data[i]; }
};

struct TarIndex {
  struct Shard {
    std::string url;   // as the user named it, for errors
    std::string path;  // what is opened
    ShardIdentity identity;
  };
  std::vector<Shard> shards;
  std::vector<std::string> extensions;  // lowercased, as the reader makes them

  IndexColumn<int64_t> shard_starts;    // shards + 1: the first sample of each shard, then the total
  IndexColumn<int64_t> sample_offsets;  // samples: the offset of each one's first header
  IndexColumn<int64_t> key_starts;      // samples + 1: each key's first byte in `keys`
  IndexColumn<char> keys;               // the keys back to back
  IndexColumn<int64_t> member_starts;   // samples + 1: each sample's first member
  IndexColumn<int32_t> member_extensions;  // members: an index into `extensions`
  IndexColumn<int64_t> member_offsets;  // members: payload offset in the shard
  IndexColumn<int64_t> member_header_offsets;  // members: first header block (extension headers included)
  IndexColumn<int64_t> member_sizes;    // members: payload bytes
  std::shared_ptr<const void> owner;    // keeps the columns' memory alive

  int64_t num_samples() const { return static_cast<int64_t>(sample_offsets.size); }
  // The shard that holds sample `id`.
  size_t shard_of(int64_t id) const;
  std::string key(int64_t id) const {
    const auto b = static_cast<size_t>(key_starts[static_cast<size_t>(id)]);
    const auto e = static_cast<size_t>(key_starts[static_cast<size_t>(id) + 1]);
    return std::string(keys.data + b, e - b);
  }
  // Throws kUsage naming the first inconsistency (columns of the wrong
  // length, offsets that do not increase, a sample without members, an
  // extension id out of range, a member whose headers do not lie between
  // its sample's offset and its payload), so that no read can go astray.
  void validate() const;
};

struct ScannedMember {
  std::string extension;
  uint64_t header_offset = 0;  // of its first header block
  uint64_t offset = 0;         // of the payload
  uint64_t size = 0;
};

struct ScannedSample {
  std::string key;
  uint64_t offset = 0;  // of its first header
  std::vector<ScannedMember> members;
};

// Every sample of a tar shard and where its payloads lie, grouped as the
// engine groups them. Throws kData for a malformed shard (as the reader).
// With `digest`, sets it to the shard's header digest (see header_digest)
// when the source was read in place (a local file that maps), hashing the
// headers where they lie; it stays empty otherwise.
std::vector<ScannedSample> scan_tar_index(std::unique_ptr<ByteSource> source,
                                          std::optional<uint64_t>* digest = nullptr);

// A digest of the header blocks of every member of `samples`, extension
// headers included, read through `shard`: what tells a rewrite of the shard
// that keeps its size (other names, sizes, layout or modification times in
// the headers) from the shard that was indexed. FNV-1a's step over the
// headers' 8-byte little-endian words (a change detector, not a defence
// against forgery).
uint64_t header_digest(const std::vector<ScannedSample>& samples, const RangeReader& shard);

}  // namespace chute

#include "tar/indexed_tar_source.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tar/sample_key.h"
#include "tar/tar_stream.h"

namespace chute {
namespace {

// One read's bytes, which the samples it brought in point into.
class ReadBuffer final : public InPlaceStorage {
 public:
  explicit ReadBuffer(size_t size) : ReadBuffer(std::unique_ptr<uint8_t[]>(new uint8_t[size])) {}

  uint8_t* bytes() { return bytes_.get(); }
  // Read whole before any sample sees it: nothing can be lost afterwards.
  bool refresh() const override { return false; }
  bool lost(const EncodedSample&) const override { return false; }
  Error lost_error(const EncodedSample& sample) const override {
    return Error(ErrorKind::kData, "sample '" + sample.key + "' was read whole", __FILE__, __LINE__);
  }
  void release(uint64_t, uint64_t) const override {}

 private:
  explicit ReadBuffer(std::unique_ptr<uint8_t[]> bytes)
      : InPlaceStorage(bytes.get()), bytes_(std::move(bytes)) {}
  std::unique_ptr<uint8_t[]> bytes_;
};

// Whether the member `name` is `key`'s member `extension` by webdataset's
// key rule (tar/sample_key.h). Most names hold the extension as indexed
// (lowercase already): they are compared without lowering them.
bool names_member(const std::string& name, const std::string& key, const std::string& extension) {
  const std::optional<size_t> key_length = sample_key_length(name);
  if (!key_length || *key_length != key.size() || name.compare(0, key.size(), key) != 0) {
    return false;
  }
  const size_t tail = key.size() + 1;
  if (name.size() - tail == extension.size() && name.compare(tail, extension.size(), extension) == 0) {
    return true;
  }
  return sample_extension(name, key.size()) == extension;
}

}  // namespace

// One sample a read() call asks for: which row of the call, and the span of
// its payloads in its shard.
struct IndexedTarSource::Wanted {
  size_t row;
  int64_t id;
  size_t shard;
  uint64_t begin;
  uint64_t end;
};

IndexedTarSource::IndexedTarSource(TarIndex index, IndexedTarOptions options, ReaderFactory open)
    : index_(std::move(index)), options_(options), open_(std::move(open)) {
  index_.validate();
}

uint64_t IndexedTarSource::payload_bytes(int64_t id) const {
  uint64_t bytes = 0;
  const auto i = static_cast<size_t>(id);
  for (auto j = static_cast<size_t>(index_.member_starts[i]);
       j < static_cast<size_t>(index_.member_starts[i + 1]); ++j) {
    bytes += static_cast<uint64_t>(index_.member_sizes[j]);
  }
  return bytes;
}

std::shared_ptr<const RangeReader> IndexedTarSource::reader(size_t shard) const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = open_readers_.find(shard);
    if (it != open_readers_.end()) {
      recent_.splice(recent_.begin(), recent_, it->second.second);
      return it->second.first;
    }
  }
  // Opened outside the lock: a slow open (a remote store) does not hold up
  // reads of the shards already open.
  const TarIndex::Shard& s = index_.shards[shard];
  std::shared_ptr<const RangeReader> opened =
      open_ ? open_(s) : open_local_range_reader(s.url, s.path, s.identity);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = open_readers_.find(shard);
  if (it != open_readers_.end()) return it->second.first;  // another thread was first
  recent_.push_front(shard);
  open_readers_.emplace(shard, std::make_pair(opened, recent_.begin()));
  while (open_readers_.size() > std::max<size_t>(1, options_.max_open)) {
    open_readers_.erase(recent_.back());  // readers still in use stay alive with their users
    recent_.pop_back();
  }
  return opened;
}

void IndexedTarSource::read(const int64_t* ids, size_t n, EncodedSample* out,
                            std::optional<Error>* errors) const {
  std::vector<Wanted> wanted;
  wanted.reserve(n);
  for (size_t row = 0; row < n; ++row) {
    const int64_t id = ids[row];
    const auto i = static_cast<size_t>(id);
    // From the first member's headers on: each member is checked against
    // its headers, which then come with the same read.
    uint64_t begin = UINT64_MAX;
    uint64_t end = 0;
    for (auto j = static_cast<size_t>(index_.member_starts[i]);
         j < static_cast<size_t>(index_.member_starts[i + 1]); ++j) {
      begin = std::min(begin, static_cast<uint64_t>(index_.member_header_offsets[j]));
      end = std::max(end, static_cast<uint64_t>(index_.member_offsets[j] + index_.member_sizes[j]));
    }
    wanted.push_back({row, id, index_.shard_of(id), begin, end});
  }
  std::sort(wanted.begin(), wanted.end(), [](const Wanted& a, const Wanted& b) {
    return a.shard != b.shard ? a.shard < b.shard : a.begin < b.begin;
  });
  size_t first = 0;
  uint64_t end = 0;
  for (size_t k = 0; k < wanted.size(); ++k) {
    const Wanted& w = wanted[k];
    const Wanted& f = wanted[first];
    const bool joins = k > first && w.shard == f.shard && w.begin <= end + options_.max_gap &&
                       std::max(end, w.end) - f.begin <= options_.max_read;
    if (k > first && !joins) {
      read_group(wanted.data() + first, wanted.data() + k, out, errors);
      first = k;
    }
    end = first == k ? w.end : std::max(end, w.end);
  }
  if (first < wanted.size()) read_group(wanted.data() + first, wanted.data() + wanted.size(), out, errors);
}

void IndexedTarSource::read_group(const Wanted* begin, const Wanted* end, EncodedSample* out,
                                  std::optional<Error>* errors) const {
  const size_t shard = begin->shard;
  const uint64_t from = begin->begin;
  uint64_t to = from;
  for (const Wanted* w = begin; w != end; ++w) to = std::max(to, w->end);
  // The samples first, so that a failed read can name them.
  for (const Wanted* w = begin; w != end; ++w) {
    EncodedSample& s = out[w->row];
    const auto i = static_cast<size_t>(w->id);
    s.key = index_.key(w->id);
    s.source_index = static_cast<uint32_t>(shard);
    s.offset = static_cast<uint64_t>(index_.sample_offsets[i]);
    s.end_offset = w->end;
    s.members.clear();
    s.nulls.clear();
    s.payload_bytes = 0;
    for (auto j = static_cast<size_t>(index_.member_starts[i]);
         j < static_cast<size_t>(index_.member_starts[i + 1]); ++j) {
      SampleMember m;
      m.extension = index_.extensions[static_cast<size_t>(index_.member_extensions[j])];
      m.name = s.key + "." + m.extension;
      m.offset = static_cast<uint64_t>(index_.member_header_offsets[j]);
      m.data_offset = static_cast<uint64_t>(index_.member_offsets[j]);
      m.data_begin = static_cast<size_t>(m.data_offset - from);
      m.data_size = static_cast<size_t>(index_.member_sizes[j]);
      s.payload_bytes += m.data_size;
      s.members.push_back(std::move(m));
    }
  }
  try {
    auto buffer = std::make_shared<ReadBuffer>(static_cast<size_t>(to - from));
    reader(shard)->read(from, static_cast<size_t>(to - from), buffer->bytes());
    reads_.fetch_add(1, std::memory_order_relaxed);
    bytes_read_.fetch_add(to - from, std::memory_order_relaxed);
    for (const Wanted* w = begin; w != end; ++w) out[w->row].in_place = buffer;
  } catch (const Error& e) {
    for (const Wanted* w = begin; w != end; ++w) {
      errors[w->row] = e.with_prefix(location(out[w->row], nullptr).text + ": ");
      out[w->row].members.clear();
      out[w->row].nulls.clear();
    }
    return;
  }
  for (const Wanted* w = begin; w != end; ++w) {
    try {
      check_headers(out[w->row], w->id, from);
    } catch (const Error& e) {
      errors[w->row] = e;
      out[w->row].members.clear();
      out[w->row].nulls.clear();
    }
  }
}

void IndexedTarSource::check_headers(const EncodedSample& sample, int64_t id, uint64_t from) const {
  const auto i = static_cast<size_t>(id);
  const std::string& url = index_.shards[sample.source_index].url;
  const uint8_t* bytes = sample.in_place->data();
  for (auto j = static_cast<size_t>(index_.member_starts[i]);
       j < static_cast<size_t>(index_.member_starts[i + 1]); ++j) {
    const SampleMember& m = sample.members[j - static_cast<size_t>(index_.member_starts[i])];
    const auto header = static_cast<uint64_t>(index_.member_header_offsets[j]);
    const size_t header_bytes = static_cast<size_t>(m.data_offset - header);
    std::string found;
    try {
      const MemberHeaders h =
          parse_member_headers(bytes + (header - from), header_bytes, url, header);
      if (h.header_bytes != header_bytes || h.size != m.data_size ||
          !names_member(h.name, sample.key, m.extension)) {
        std::ostringstream os;
        os << "the header there is member '" << h.name << "' of " << h.size
           << " bytes with its payload at offset " << header + h.header_bytes;
        found = os.str();
      }
    } catch (const Error& e) {
      found = e.message();
    }
    CHUTE_CHECK(found.empty(), kData,
                "shard '" << url << "': its index does not describe member '" << m.name
                          << "' (" << m.data_size << " bytes at offset " << m.data_offset
                          << ", headers at offset " << header << "): " << found
                          << ". The shard changed after it was indexed or the index is corrupt: "
                             "rebuild the index (`chute index`, or delete it and open the "
                             "dataset again)");
  }
}

SampleLocation IndexedTarSource::location(const EncodedSample& sample,
                                          const SampleMember* member) const {
  const std::string& url = index_.shards[sample.source_index].url;
  std::ostringstream os;
  os << "shard '" << url << "'";
  if (member != nullptr) {
    os << ", member '" << member->name << "' (payload at offset " << member->data_offset << ")";
  } else {
    os << ", sample '" << sample.key << "' at offset " << sample.offset;
  }
  return {os.str(), {url, member != nullptr ? member->name : "", sample.key}};
}

}  // namespace chute

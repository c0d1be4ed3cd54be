#include "tar/sample_reader.h"

#include <algorithm>

#include "core/error.h"
#include "tar/mapped_shard.h"
#include "tar/tar_stream.h"

namespace chute {
namespace {

// A declared size is trusted for a reservation only up to this much; beyond
// it the payload buffer grows as the bytes arrive.
constexpr uint64_t kMaxReserve = uint64_t{64} << 20;

// webdataset's tar_file_iterator drops metadata members: a top-level
// `__name__`, or any path whose first component matches `__[^/]*__`
// (re.match of r"__[^/]*__($|/)").
bool is_meta_name(const std::string& name) {
  const size_t slash = name.find('/');
  const size_t first_len = slash == std::string::npos ? name.size() : slash;
  if (first_len < 2 || name.compare(0, 2, "__") != 0) return false;
  if (first_len < 4) return slash == std::string::npos && first_len == name.size() &&
                            name.compare(name.size() - 2, 2, "__") == 0;
  return name.compare(first_len - 2, 2, "__") == 0;
}

// Length of the key under webdataset's base_plus_ext regex
// `^((?:.*/|)[^.]+)[.]([^/]*)$`, or npos when the name does not match (such
// members are skipped). Normally the key ends at the first dot of the
// basename; a basename that starts with a dot makes the regex backtrack, so
// "d/.x.y" has key "d/" and extension "x.y" when the last directory contains
// no dot.
size_t key_length(const std::string& name) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string::npos) return std::string::npos;
  if (dot > base) return dot;
  if (slash == std::string::npos) return std::string::npos;
  const size_t prev = slash == 0 ? std::string::npos : name.rfind('/', slash - 1);
  const size_t seg = prev == std::string::npos ? 0 : prev + 1;
  if (name.find('.', seg) < slash) return std::string::npos;
  // `.*` stops at a newline, so the `(?:.*/|)` part cannot span one.
  if (name.find('\n') < seg) return std::string::npos;
  return dot;
}

void lowercase_ascii(std::string& s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
}

}  // namespace

struct SampleReader::Impl {
  TarStream stream;
  std::shared_ptr<const MappedShard> storage;  // set when reading in place
  uint32_t source_index;
  TarMember pending;          // next member to place, payload not yet read
  size_t pending_key_len = 0;
  bool has_pending = false;
  // Sizes of the previous sample: samples of a shard tend to be alike, so one
  // exact reservation usually covers the next one (samples are moved into a
  // shuffle buffer, so their capacity beyond size is memory held for nothing).
  size_t data_hint = 0;
  size_t members_hint = 0;

  Impl(std::unique_ptr<ByteSource> source, uint32_t index, bool in_place)
      : stream(std::move(source), size_t{1} << 20, in_place), source_index(index) {
    if (stream.mapping()) storage = std::make_shared<MappedShard>(stream.mapping(), stream.url());
  }

  // Advances to the next member that webdataset would keep.
  bool advance() {
    while (stream.next(pending)) {
      if (is_meta_name(pending.name)) continue;
      pending_key_len = key_length(pending.name);
      if (pending_key_len == std::string::npos) continue;
      return true;
    }
    return false;
  }

  bool pending_matches(const std::string& key) const {
    return pending_key_len == key.size() && pending.name.compare(0, key.size(), key) == 0;
  }
};

SampleReader::SampleReader(std::unique_ptr<ByteSource> source, uint32_t source_index,
                           bool in_place)
    : impl_(std::make_unique<Impl>(std::move(source), source_index, in_place)) {}

bool SampleReader::in_place() const { return impl_->storage != nullptr; }

SampleReader::~SampleReader() = default;

bool SampleReader::next(EncodedSample& out) {
  Impl& s = *impl_;
  out.key.clear();
  out.members.clear();
  out.data.clear();
  out.in_place = s.storage;
  out.payload_bytes = 0;
  out.source_index = s.source_index;
  if (!s.has_pending) s.has_pending = s.advance();
  if (!s.has_pending) return false;

  out.key.assign(s.pending.name, 0, s.pending_key_len);
  out.offset = s.pending.header_offset;
  if (!out.in_place) out.data.reserve(s.data_hint);
  out.members.reserve(s.members_hint);
  do {
    SampleMember m;
    m.extension.assign(s.pending.name, s.pending_key_len + 1, std::string::npos);
    lowercase_ascii(m.extension);
    // webdataset keeps __key__ and __url__ in the same dict as the payloads,
    // so those extensions collide too.
    const bool duplicate = out.find(m.extension) != nullptr || m.extension == "__key__" ||
                           m.extension == "__url__";
    CHUTE_CHECK(!duplicate, kData,
                "duplicate file name in tar archive '" << s.stream.url() << "': member '"
                                                       << s.pending.name << "' at offset "
                                                       << s.pending.header_offset << " repeats extension '"
                                                       << m.extension << "' of sample '" << out.key
                                                       << "' (sample at offset " << out.offset << ")");
    m.name = s.pending.name;
    m.offset = s.pending.header_offset;
    m.data_offset = s.pending.data_offset;
    m.data_size = static_cast<size_t>(s.pending.size);
    if (out.in_place) {
      m.data_begin = static_cast<size_t>(s.stream.payload_in_place() - out.in_place->data());
    } else {
      m.data_begin = out.data.size();
      const size_t need = out.data.size() + static_cast<size_t>(std::min(s.pending.size, kMaxReserve));
      if (need > out.data.capacity()) out.data.reserve(need);
      s.stream.read_payload(out.data);
    }
    out.payload_bytes += m.data_size;
    out.end_offset = s.pending.data_offset + s.pending.size;
    out.members.push_back(std::move(m));
    s.has_pending = s.advance();
  } while (s.has_pending && s.pending_matches(out.key));

  s.data_hint = out.data.size();
  s.members_hint = out.members.size();
  return true;
}

}  // namespace chute

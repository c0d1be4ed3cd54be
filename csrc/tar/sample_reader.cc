#include "tar/sample_reader.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "tar/mapped_shard.h"
#include "tar/sample_key.h"
#include "tar/tar_stream.h"

namespace chute {
namespace {

// A declared size is trusted for a reservation only up to this much; beyond
// it the payload buffer grows as the bytes arrive.
constexpr uint64_t kMaxReserve = uint64_t{64} << 20;

// Moves the payloads of an in-place sample into its own buffer: a member
// that cannot be read in place (a sparse file) joined it.
void copy_out_of_place(EncodedSample& out) {
  const uint8_t* base = out.in_place->data();
  out.data.clear();
  for (SampleMember& m : out.members) {
    const size_t begin = out.data.size();
    out.data.insert(out.data.end(), base + m.data_begin, base + m.data_begin + m.data_size);
    m.data_begin = begin;
  }
  out.in_place.reset();
}

}  // namespace

struct SampleReader::Impl {
  TarStream stream;
  std::shared_ptr<const MappedShard> storage;  // set when reading in place
  uint32_t source_index;
  TarMember pending;          // next member to place, payload not yet read
  size_t pending_key_len = 0;
  bool has_pending = false;
  // Errors of the sample handed out last, thrown one per call before
  // anything else.
  struct Deferred {
    Error error;
    SampleSource::Failure cost;
  };
  std::deque<Deferred> deferred;
  bool ended = false;             // the archive ended at an error
  SampleSource::Failure failure;  // what the last error cost
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
      const std::optional<size_t> length = sample_key_length(pending.name);
      if (!length) continue;
      pending_key_len = *length;
      return true;
    }
    return false;
  }

  bool pending_matches(const std::string& key) const {
    return pending_key_len == key.size() && pending.name.compare(0, key.size(), key) == 0;
  }

  // Adds the pending member to `out`, or explains why it stays out: a
  // fault makes the whole sample bad; a repeated extension is left out.
  void place(EncodedSample& out, std::optional<Error>& bad, std::vector<Error>& repeats) {
    if (bad) return;  // the sample is lost anyway; the stream skips the payload
    if (!pending.fault.empty()) {
      std::ostringstream os;
      os << "tar archive '" << stream.url() << "': member '" << pending.name << "' at offset "
         << pending.header_offset << " cannot be read: " << pending.fault << " (sample '"
         << out.key << "' at offset " << out.offset << " is lost)";
      bad.emplace(ErrorKind::kData, os.str(), __FILE__, __LINE__);
      return;
    }
    SampleMember m;
    m.extension = sample_extension(pending.name, pending_key_len);
    // webdataset keeps __key__ and __url__ in the same dict as the payloads,
    // so those extensions collide too.
    if (out.find(m.extension) != nullptr || m.extension == "__key__" || m.extension == "__url__") {
      std::ostringstream os;
      os << "duplicate file name in tar archive '" << stream.url() << "': member '"
         << pending.name << "' at offset " << pending.header_offset << " repeats extension '"
         << m.extension << "' of sample '" << out.key << "' (sample at offset " << out.offset
         << ")";
      repeats.emplace_back(ErrorKind::kData, os.str(), __FILE__, __LINE__);
      return;
    }
    m.name = pending.name;
    m.offset = pending.header_offset;
    m.data_offset = pending.sparse ? SampleMember::kScattered : pending.data_offset;
    m.data_size = static_cast<size_t>(pending.size);
    if (out.in_place && pending.sparse) copy_out_of_place(out);
    if (out.in_place) {
      m.data_begin = static_cast<size_t>(stream.payload_in_place() - out.in_place->data());
    } else {
      m.data_begin = out.data.size();
      const size_t need = out.data.size() + static_cast<size_t>(std::min(pending.size, kMaxReserve));
      if (need > out.data.capacity()) out.data.reserve(need);
      stream.read_payload(out.data);
    }
    out.payload_bytes += m.data_size;
    out.end_offset = pending.data_offset + pending.stored_size;
    out.members.push_back(std::move(m));
  }

  // Every error of the reader leaves through here: the archive's structure,
  // its compression and the reads under them, all read failures of the shard.
  [[noreturn]] void fail(const Error& error, bool resumable, uint64_t lost) {
    failure = SampleSource::Failure{resumable, lost};
    throw error.scoped(ErrorScope::kRead, {stream.url(), "", ""});
  }
};

SampleReader::SampleReader(std::unique_ptr<ByteSource> source, uint32_t source_index,
                           bool in_place)
    : impl_(std::make_unique<Impl>(std::move(source), source_index, in_place)) {}

bool SampleReader::in_place() const { return impl_->storage != nullptr; }

SampleSource::Failure SampleReader::failure() const { return impl_->failure; }

SampleReader::~SampleReader() = default;

bool SampleReader::next(EncodedSample& out) {
  Impl& s = *impl_;
  out.key.clear();
  out.members.clear();
  out.nulls.clear();
  out.data.clear();
  out.in_place = s.storage;
  out.payload_bytes = 0;
  out.source_index = s.source_index;
  out.flawed = false;
  if (!s.deferred.empty()) {
    const Impl::Deferred d = std::move(s.deferred.front());
    s.deferred.pop_front();
    s.fail(d.error, d.cost.resumable, d.cost.samples_lost);
  }
  if (s.ended) return false;
  if (!s.has_pending) {
    try {
      s.has_pending = s.advance();
    } catch (const Error& e) {
      s.ended = true;
      s.fail(e, false, 1);
    }
  }
  if (!s.has_pending) return false;

  out.key.assign(s.pending.name, 0, s.pending_key_len);
  out.offset = s.pending.header_offset;
  if (!out.in_place) out.data.reserve(s.data_hint);
  out.members.reserve(s.members_hint);
  const bool mapped = out.in_place != nullptr;
  std::optional<Error> bad;
  std::vector<Error> repeats;
  try {
    do {
      s.place(out, bad, repeats);
      s.has_pending = s.advance();
    } while (s.has_pending && s.pending_matches(out.key));
  } catch (const Error& e) {
    // A truncation or a corrupt header: the archive ends here, and what was
    // read of this sample is all there is of it.
    s.ended = true;
    s.has_pending = false;
    if (bad) {
      // The end cut the sample already lost: it costs nothing more.
      s.deferred.push_back({e, {false, 0}});
      s.fail(*bad, true, 1);
    }
    if (out.members.empty()) s.fail(e, false, 1);
    for (const Error& r : repeats) s.deferred.push_back({r, {true, 0}});
    s.deferred.push_back({e, {false, 1}});
    // Ended at the first header block of a member after its last one, the
    // sample is whole as far as the archive tells (webdataset's tarfile ends
    // quietly there and delivers it). Cut anywhere else (a member's data or
    // padding, an extension header), it is flawed: under raise webdataset
    // raises there without it.
    out.flawed = !repeats.empty() || !s.stream.failed_at_a_member_start();
    return true;
  }
  if (bad) s.fail(*bad, true, 1);
  // Copied out of a mapping: bytes past a cut read as zeros, and nothing
  // else will look at them again.
  if (mapped && !out.in_place && s.storage->refresh() && s.storage->lost(out)) {
    s.ended = true;
    s.has_pending = false;
    s.fail(s.storage->lost_error(out), false, 1);
  }
  for (Error& r : repeats) s.deferred.push_back({std::move(r), {true, 0}});
  out.flawed = !repeats.empty();
  s.data_hint = out.data.size();
  s.members_hint = out.members.size();
  return true;
}

}  // namespace chute

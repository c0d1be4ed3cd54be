// Test-only: encoded samples built in memory, a source factory that only
// says where samples are, in-place storage whose bytes a test can declare
// lost, and a small field decoder with a format a test spells out by hand,
// for the pipeline's unit tests (sample_fields_test.cc, stream_batch_test.cc)
// and the composition's (compose/).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "sources/encoded_sample.h"
#include "sources/field_decoder.h"
#include "sources/sample_source.h"

namespace chute::test {

using Members = std::vector<std::pair<std::string, std::string>>;  // (extension, payload)

// A sample whose payloads are copied back to back into its own buffer, as a
// source that does not read in place yields it. Member m's name is
// "<key>.<extension>" and its source offset is offset + 1000 * (m + 1).
inline EncodedSample encoded_sample(const std::string& key, const Members& members,
                                    uint32_t source_index = 0, uint64_t offset = 0) {
  EncodedSample s;
  s.key = key;
  s.source_index = source_index;
  s.offset = offset;
  for (size_t m = 0; m < members.size(); ++m) {
    SampleMember member;
    member.extension = members[m].first;
    member.name = key + "." + members[m].first;
    member.offset = offset + 1000 * (m + 1);
    member.data_begin = s.data.size();
    member.data_size = members[m].second.size();
    s.data.insert(s.data.end(), members[m].second.begin(), members[m].second.end());
    s.members.push_back(std::move(member));
  }
  s.payload_bytes = s.data.size();
  s.end_offset = offset + 1000 * (members.size() + 1);
  return s;
}

// A factory that opens nothing (a test hands samples over itself) and names
// a sample as "<url> sample '<key>'", adding " member '<name>'".
class LocatingSources final : public SampleSourceFactory {
 public:
  std::unique_ptr<SampleSource> open(const std::string& url, uint32_t,
                                     const SourceOpenOptions&) const override {
    CHUTE_CHECK(false, kUsage, "test sources open nothing ('" << url << "')");
    return nullptr;
  }
  SampleLocation location(const std::string& url, const EncodedSample& sample,
                          const SampleMember* member) const override {
    std::string out = url + " sample '" + sample.key + "'";
    if (member != nullptr) out += " member '" + member->name + "'";
    return {out, {url, member != nullptr ? member->name : "", sample.key}};
  }
};

// Payloads shared in place, as a mapped shard holds them: samples made by
// in_place_samples() point into it. A test may declare samples lost (their
// bytes were cut away underneath) before a batch is decoded; the storage
// records the source ranges released to it.
struct StorageBytes {
  std::string bytes;
};

class TestStorage final : private StorageBytes, public InPlaceStorage {
 public:
  explicit TestStorage(std::string bytes)
      : StorageBytes{std::move(bytes)},
        InPlaceStorage(reinterpret_cast<const uint8_t*>(StorageBytes::bytes.data())) {}

  void lose(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    lost_.insert(key);
  }
  std::vector<std::pair<uint64_t, uint64_t>> released() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return released_;
  }

  bool refresh() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return !lost_.empty();
  }
  bool lost(const EncodedSample& sample) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return lost_.count(sample.key) != 0;
  }
  Error lost_error(const EncodedSample& sample) const override {
    return Error(ErrorKind::kIo, "sample '" + sample.key + "' was cut from the shard", __FILE__,
                 __LINE__, ErrorScope::kRead, {"", "", sample.key});
  }
  void release(uint64_t begin, uint64_t end) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    released_.emplace_back(begin, end);
  }

 private:
  mutable std::mutex mutex_;
  std::set<std::string> lost_;
  mutable std::vector<std::pair<uint64_t, uint64_t>> released_;
};

// Samples laid out back to back in one TestStorage (stored in *storage),
// each pointing into it: a sample spans its payloads' source offsets, which
// are their offsets in the storage.
inline std::vector<EncodedSample> in_place_samples(
    const std::vector<std::pair<std::string, Members>>& samples,
    std::shared_ptr<TestStorage>* storage) {
  std::string bytes;
  std::vector<EncodedSample> out;
  for (const auto& [key, members] : samples) {
    EncodedSample s;
    s.key = key;
    s.offset = bytes.size();
    for (const auto& [extension, payload] : members) {
      SampleMember member;
      member.extension = extension;
      member.name = key + "." + extension;
      member.offset = bytes.size();
      member.data_begin = bytes.size();
      member.data_size = payload.size();
      bytes += payload;
      s.payload_bytes += payload.size();
      s.members.push_back(std::move(member));
    }
    s.end_offset = bytes.size();
    out.push_back(std::move(s));
  }
  *storage = std::make_shared<TestStorage>(std::move(bytes));
  for (EncodedSample& s : out) s.in_place = *storage;
  return out;
}

// A field format simple enough to write by hand: a payload of decimal
// digits becomes a uint8 row of their values ("305" -> [3, 0, 5]). The
// header is the payload's first byte: '!' is a bad header (probe fails); any
// other non-digit fails only when the row is decoded.
class DigitsDecoder final : public FieldDecoder {
 public:
  void probe(const uint8_t* data, size_t size, ProbedField& out) const override {
    CHUTE_CHECK(size == 0 || data[0] != '!', kData, "bad digits header '!'");
    out.dtype = DType::kU8;
    out.shape.assign({static_cast<int64_t>(size)});
    out.detail[0] = static_cast<int64_t>(size);
  }
  void decode(const uint8_t* data, size_t size, const ProbedField& probed, const RowPosition&,
              uint8_t* out) const override {
    CHUTE_CHECK(static_cast<int64_t>(size) == probed.detail[0], kData, "size changed");
    for (size_t i = 0; i < size; ++i) {
      CHUTE_CHECK(data[i] >= '0' && data[i] <= '9', kData,
                  "not a digit: '" << static_cast<char>(data[i]) << "'");
      out[i] = static_cast<uint8_t>(data[i] - '0');
    }
  }
};

// Ignores the payload; each row is where the engine said it was: int64
// {seed, epoch, batch, row, field}.
class PositionDecoder final : public FieldDecoder {
 public:
  void probe(const uint8_t*, size_t, ProbedField& out) const override {
    out.dtype = DType::kI64;
    out.shape.assign({5});
  }
  void decode(const uint8_t*, size_t, const ProbedField&, const RowPosition& at,
              uint8_t* out) const override {
    const int64_t row[5] = {static_cast<int64_t>(at.seed), at.epoch, at.batch,
                            static_cast<int64_t>(at.row), static_cast<int64_t>(at.field)};
    std::memcpy(out, row, sizeof row);
  }
};

}  // namespace chute::test

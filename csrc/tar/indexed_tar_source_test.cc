#include "tar/indexed_tar_source.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "tar/archive_testing.h"
#include "tar/tar_index.h"

namespace chute {
namespace {

using test::end_blocks;
using test::file;
using test::MemorySource;

// Sample i: "k<i>.cls" holding "<i>" and "k<i>.bin" holding i + 1 bytes of 'a' + i % 26.
std::string archive(int samples, const std::string& prefix = "k") {
  std::string tar;
  for (int i = 0; i < samples; ++i) {
    tar += file(prefix + std::to_string(i) + ".cls", std::to_string(i));
    tar += file(prefix + std::to_string(i) + ".bin", std::string(static_cast<size_t>(i + 1),
                                                               static_cast<char>('a' + i % 26)));
  }
  return tar + end_blocks();
}

// The shards' bytes, served by range, counting what is asked of them.
struct Store {
  std::vector<std::string> shards;
  int reads = 0;
  int opens = 0;
  uint64_t cut = UINT64_MAX;  // shards end here (a shard cut after it was indexed)
};

class StoreReader final : public RangeReader {
 public:
  StoreReader(std::shared_ptr<Store> store, size_t shard, std::string url)
      : store_(std::move(store)), shard_(shard), url_(std::move(url)) {}
  void read(uint64_t offset, size_t size, uint8_t* dst) const override {
    store_->reads += 1;
    const std::string& bytes = store_->shards[shard_];
    const uint64_t end = std::min<uint64_t>(bytes.size(), store_->cut);
    CHUTE_CHECK(offset + size <= end, kData, "shard '" << url_ << "' ends at " << end);
    std::memcpy(dst, bytes.data() + offset, size);
  }
  const std::string& url() const override { return url_; }

 private:
  std::shared_ptr<Store> store_;
  size_t shard_;
  std::string url_;
};

// The index of the store's shards as TarDataset hands it over: columns that
// an owner keeps alive.
struct Columns {
  std::vector<int64_t> shard_starts{0}, sample_offsets, key_starts{0}, member_starts{0},
      member_offsets, member_sizes, member_header_offsets;
  std::vector<int32_t> member_extensions;
  std::string keys;
};

template <typename T>
IndexColumn<T> view(const std::vector<T>& v) {
  return IndexColumn<T>{v.data(), v.size()};
}

// `edit` changes the columns before the index views them (a corrupt index).
TarIndex index_of(const std::vector<std::string>& shards,
                  const std::function<void(Columns&)>& edit = nullptr) {
  auto c = std::make_shared<Columns>();
  TarIndex index;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string url = "shard" + std::to_string(s) + ".tar";
    index.shards.push_back({url, url, ShardIdentity{static_cast<int64_t>(shards[s].size()), -1, ""}});
    for (const ScannedSample& sample : scan_tar_index(std::make_unique<MemorySource>(shards[s], 1000, url))) {
      c->sample_offsets.push_back(static_cast<int64_t>(sample.offset));
      c->keys += sample.key;
      c->key_starts.push_back(static_cast<int64_t>(c->keys.size()));
      for (const ScannedMember& m : sample.members) {
        auto it = std::find(index.extensions.begin(), index.extensions.end(), m.extension);
        if (it == index.extensions.end()) it = index.extensions.insert(it, m.extension);
        c->member_extensions.push_back(static_cast<int32_t>(it - index.extensions.begin()));
        c->member_offsets.push_back(static_cast<int64_t>(m.offset));
        c->member_sizes.push_back(static_cast<int64_t>(m.size));
        c->member_header_offsets.push_back(static_cast<int64_t>(m.header_offset));
      }
      c->member_starts.push_back(static_cast<int64_t>(c->member_offsets.size()));
    }
    c->shard_starts.push_back(static_cast<int64_t>(c->sample_offsets.size()));
  }
  if (edit) edit(*c);
  index.shard_starts = view(c->shard_starts);
  index.sample_offsets = view(c->sample_offsets);
  index.key_starts = view(c->key_starts);
  index.keys = IndexColumn<char>{c->keys.data(), c->keys.size()};
  index.member_starts = view(c->member_starts);
  index.member_extensions = view(c->member_extensions);
  index.member_offsets = view(c->member_offsets);
  index.member_sizes = view(c->member_sizes);
  index.member_header_offsets = view(c->member_header_offsets);
  index.owner = c;
  return index;
}

std::unique_ptr<IndexedTarSource> source_over(std::shared_ptr<Store> store,
                                              IndexedTarOptions options = {},
                                              const std::function<void(Columns&)>& edit = nullptr) {
  return std::make_unique<IndexedTarSource>(
      index_of(store->shards, edit), options, [store](const TarIndex::Shard& shard) {
        store->opens += 1;
        const size_t s = static_cast<size_t>(shard.url[5] - '0');
        return std::make_unique<StoreReader>(store, s, shard.url);
      });
}

std::string payload(const EncodedSample& s, const std::string& extension) {
  const SampleMember* m = s.find(extension);
  if (m == nullptr) return "<absent>";
  return std::string(reinterpret_cast<const char*>(s.bytes()) + m->data_begin, m->data_size);
}

struct Read {
  std::vector<EncodedSample> samples;
  std::vector<std::optional<Error>> errors;
};

Read read(const IndexedTarSource& source, const std::vector<int64_t>& ids) {
  Read r{std::vector<EncodedSample>(ids.size()), std::vector<std::optional<Error>>(ids.size())};
  source.read(ids.data(), ids.size(), r.samples.data(), r.errors.data());
  return r;
}

TEST(TarIndexScan, PayloadOffsetsPointAtThePayloadsBehindExtensionHeaders) {
  const std::string long_dir(120, 'd');
  const std::string tar = test::extension('x', test::pax_record("path", long_dir + "/a.TXT")) +
                          file("ignored", "long") + test::extension('L', long_dir + "/a.cls") +
                          file("ignored", "7") +
                          file("README", "no extension") + file("b.cls", "8") + end_blocks();
  const std::vector<ScannedSample> samples = scan_tar_index(std::make_unique<MemorySource>(tar, 100));
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].key, long_dir + "/a");
  EXPECT_EQ(samples[0].offset, 0u);  // the PAX header, where the member starts
  ASSERT_EQ(samples[0].members.size(), 2u);
  EXPECT_EQ(samples[0].members[0].extension, "txt");
  EXPECT_EQ(samples[0].members[1].extension, "cls");
  EXPECT_EQ(tar.substr(samples[0].members[0].offset, samples[0].members[0].size), "long");
  EXPECT_EQ(tar.substr(samples[0].members[1].offset, samples[0].members[1].size), "7");
  EXPECT_EQ(samples[1].key, "b");
  EXPECT_EQ(tar.substr(samples[1].members[0].offset, samples[1].members[0].size), "8");
}

TEST(TarIndexScan, HeaderDigestCoversEveryIndexedHeaderAndOnlyThem) {
  auto store = std::make_shared<Store>();
  store->shards = {archive(3)};
  const StoreReader reader(store, 0, "s.tar");
  std::optional<uint64_t> in_place;
  const std::vector<ScannedSample> samples =
      scan_tar_index(std::make_unique<MemorySource>(store->shards[0], 100), &in_place);
  EXPECT_FALSE(in_place);  // a memory source does not map
  const uint64_t digest = header_digest(samples, reader);
  // Payload bytes do not count; a header byte does.
  std::string& bytes = store->shards[0];
  bytes[samples[1].members[0].offset] ^= 1;
  EXPECT_EQ(header_digest(samples, reader), digest);
  bytes[samples[1].members[0].header_offset + 3] ^= 1;
  EXPECT_NE(header_digest(samples, reader), digest);
}

TEST(IndexedTarSource, ConsecutiveSamplesShareOneRead) {
  auto store = std::make_shared<Store>();
  store->shards = {archive(40)};
  const auto source = source_over(store);
  std::vector<int64_t> ids(40);
  for (int i = 0; i < 40; ++i) ids[static_cast<size_t>(i)] = i;
  const Read r = read(*source, ids);
  EXPECT_EQ(store->reads, 1);
  EXPECT_EQ(source->reads(), 1u);
  for (int i = 0; i < 40; ++i) {
    const EncodedSample& s = r.samples[static_cast<size_t>(i)];
    ASSERT_FALSE(r.errors[static_cast<size_t>(i)]);
    EXPECT_EQ(s.key, "k" + std::to_string(i));
    EXPECT_EQ(payload(s, "cls"), std::to_string(i));
    EXPECT_EQ(payload(s, "bin"), std::string(static_cast<size_t>(i + 1), static_cast<char>('a' + i % 26)));
    EXPECT_EQ(s.members[0].name, "k" + std::to_string(i) + ".cls");
    EXPECT_EQ(s.payload_bytes, std::to_string(i).size() + static_cast<size_t>(i + 1));
    EXPECT_EQ(source->payload_bytes(i), s.payload_bytes);
  }
  // One read spans from the first payload wanted to the end of the last.
  EXPECT_EQ(source->bytes_read(), r.samples.back().end_offset - r.samples.front().members[0].offset);
}

TEST(IndexedTarSource, RowsKeepTheOrderAskedAndRepeatsShareTheirBytes) {
  auto store = std::make_shared<Store>();
  store->shards = {archive(10)};
  const auto source = source_over(store);
  const Read r = read(*source, {7, 2, 7, 0});
  EXPECT_EQ(store->reads, 1);
  const std::vector<std::string> keys{r.samples[0].key, r.samples[1].key, r.samples[2].key,
                                      r.samples[3].key};
  EXPECT_EQ(keys, (std::vector<std::string>{"k7", "k2", "k7", "k0"}));
  EXPECT_EQ(payload(r.samples[2], "bin"), std::string(8, 'h'));
  EXPECT_EQ(r.samples[0].in_place, r.samples[3].in_place);
}

TEST(IndexedTarSource, GapsAndSizeBoundSplitReads) {
  auto store = std::make_shared<Store>();
  store->shards = {archive(10)};
  IndexedTarOptions no_gap;
  no_gap.max_gap = 0;  // every sample has a header between it and the next
  const auto apart = source_over(store, no_gap);
  read(*apart, {0, 1, 2});
  EXPECT_EQ(store->reads, 3);

  store->reads = 0;
  IndexedTarOptions small;
  small.max_read = 4 * 1024;  // two samples: a header and a block per member, 2 KiB each
  const auto bounded = source_over(store, small);
  const Read r = read(*bounded, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(store->reads, 3);
  EXPECT_EQ(payload(r.samples[5], "cls"), "5");
}

TEST(IndexedTarSource, ShardsAreReadApartAndReadersStayBounded) {
  auto store = std::make_shared<Store>();
  store->shards = {archive(3, "a"), archive(3, "b"), archive(3, "c")};
  IndexedTarOptions one_open;
  one_open.max_open = 1;
  const auto source = source_over(store, one_open);
  const Read r = read(*source, {8, 0, 4});
  EXPECT_EQ(store->reads, 3);
  EXPECT_EQ(r.samples[0].key, "c2");
  EXPECT_EQ(r.samples[0].source_index, 2u);
  EXPECT_EQ(r.samples[1].key, "a0");
  EXPECT_EQ(r.samples[2].key, "b1");
  EXPECT_EQ(store->opens, 3);
  read(*source, {5});  // shard 1 was closed when shard 2 opened
  EXPECT_EQ(store->opens, 4);
  read(*source, {3});
  EXPECT_EQ(store->opens, 4);
}

TEST(IndexedTarSource, AShortShardFailsOnlyTheSamplesItLacks) {
  auto store = std::make_shared<Store>();
  store->shards = {archive(10)};
  IndexedTarOptions no_gap;
  no_gap.max_gap = 0;
  const auto source = source_over(store, no_gap);
  store->cut = static_cast<uint64_t>(index_of(store->shards).sample_offsets[6]);
  const Read r = read(*source, {1, 8});
  ASSERT_FALSE(r.errors[0]);
  EXPECT_EQ(payload(r.samples[0], "cls"), "1");
  ASSERT_TRUE(r.errors[1]);
  EXPECT_EQ(r.errors[1]->kind(), ErrorKind::kData);
  EXPECT_NE(r.errors[1]->message().find("shard 'shard0.tar', sample 'k8' at offset"),
            std::string::npos)
      << r.errors[1]->message();
  EXPECT_NE(r.errors[1]->message().find("ends at"), std::string::npos);
}

TEST(IndexedTarSource, LocationNamesShardMemberAndPayloadOffset) {
  auto store = std::make_shared<Store>();
  store->shards = {archive(4)};
  const auto source = source_over(store);
  const Read r = read(*source, {3});
  const SampleMember* m = r.samples[0].find("bin");
  ASSERT_NE(m, nullptr);
  const SampleLocation at = source->location(r.samples[0], m);
  EXPECT_EQ(at.text, "shard 'shard0.tar', member 'k3.bin' (payload at offset " +
                         std::to_string(m->data_offset) + ")");
  EXPECT_EQ(at.place.url, "shard0.tar");
  EXPECT_EQ(at.place.member, "k3.bin");
  EXPECT_EQ(at.place.key, "k3");
  EXPECT_EQ(store->shards[0].substr(m->data_offset, m->data_size), "dddd");
}

// Every read checks each member against the headers before its payload.
std::string header_error(const std::function<void(Columns&)>& edit, int64_t id) {
  auto store = std::make_shared<Store>();
  store->shards = {archive(6)};
  const auto source = source_over(store, {}, edit);
  const Read r = read(*source, {id});
  if (!r.errors[0]) return "";
  EXPECT_EQ(r.errors[0]->kind(), ErrorKind::kData);
  EXPECT_TRUE(r.samples[0].members.empty());
  return r.errors[0]->message();
}

TEST(IndexedTarSource, MembersAreCheckedAgainstTheirHeaders) {
  EXPECT_EQ(header_error(nullptr, 3), "");
  // Keys 1 and 2 swapped (one byte each, "k1" and "k2").
  const std::string swapped = header_error([](Columns& c) { std::swap(c.keys[3], c.keys[5]); }, 2);
  EXPECT_NE(swapped.find("shard 'shard0.tar': its index does not describe member 'k1.cls'"),
            std::string::npos)
      << swapped;
  EXPECT_NE(swapped.find("the header there is member 'k2.cls'"), std::string::npos) << swapped;
  // A payload one byte off: the headers no longer end where it starts.
  const std::string shifted = header_error([](Columns& c) { c.member_offsets[7] += 1; }, 3);
  EXPECT_NE(shifted.find("member 'k3.bin'"), std::string::npos) << shifted;
  EXPECT_NE(shifted.find("with its payload at offset"), std::string::npos) << shifted;
  // A size that is not the header's.
  const std::string resized = header_error([](Columns& c) { c.member_sizes[9] -= 1; }, 4);
  EXPECT_NE(resized.find("member 'k4.bin' (4 bytes"), std::string::npos) << resized;
  // Headers recorded one block late: no header there at all.
  const std::string moved = header_error(
      [](Columns& c) {
        c.member_header_offsets[2] += 512;
        c.member_offsets[2] += 512;
      },
      1);
  EXPECT_NE(moved.find("member 'k1.cls'"), std::string::npos) << moved;
}

TEST(TarIndex, InconsistentColumnsAreRefused) {
  auto store = std::make_shared<Store>();
  store->shards = {archive(3)};
  {
    TarIndex index = index_of(store->shards);
    index.shards[0].identity.size = 1024;  // the payloads lie past it
    const std::optional<Error> e = test::error_from([&] { IndexedTarSource s(std::move(index)); });
    ASSERT_TRUE(e);
    EXPECT_EQ(e->kind(), ErrorKind::kUsage);
    EXPECT_NE(e->message().find("shard 'shard0.tar' of 1024 bytes"), std::string::npos);
  }
  {
    TarIndex index = index_of(store->shards);
    index.member_starts.size -= 1;
    EXPECT_TRUE(test::error_from([&] { index.validate(); }));
  }
  {
    TarIndex index = index_of(store->shards);
    index.extensions.pop_back();  // "bin" ids now point past the table
    EXPECT_TRUE(test::error_from([&] { index.validate(); }));
  }
  {
    // Headers that would reach into the payload they stand before.
    const TarIndex index = index_of(store->shards, [](Columns& c) { c.member_header_offsets[3] += 1; });
    const std::optional<Error> e = test::error_from([&] { index.validate(); });
    ASSERT_TRUE(e);
    EXPECT_NE(e->message().find("sample 1 has a member whose headers at"), std::string::npos)
        << e->message();
  }
}

}  // namespace
}  // namespace chute

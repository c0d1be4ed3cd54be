#include "engine/indexed_engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "sources/block_sample_source.h"

namespace chute {
namespace {

// Sample i: key "k<i>", a member "v" of i % 3 + 1 bytes and, when i is
// even, a member "w" of one byte; every byte is i % 200. Sample `unreadable`
// cannot be read; sample `bad` has bytes 0xEE, a bad header for CopyDecoder.
class FakeSamples final : public IndexedSampleSource {
 public:
  explicit FakeSamples(int64_t n, int64_t unreadable = -1, int64_t bad = -1)
      : n_(n), unreadable_(unreadable), bad_(bad) {}

  int64_t num_samples() const override { return n_; }
  uint64_t payload_bytes(int64_t id) const override { return static_cast<uint64_t>(id % 3 + 1); }

  void read(const int64_t* ids, size_t n, EncodedSample* out,
            std::optional<Error>* errors) const override {
    for (size_t r = 0; r < n; ++r) {
      const int64_t id = ids[r];
      EncodedSample& s = out[r];
      s.key = "k" + std::to_string(id);
      s.offset = static_cast<uint64_t>(id) * 100;
      if (id == unreadable_) {
        errors[r] = Error(ErrorKind::kIo, "fake '" + s.key + "': cannot read", __FILE__, __LINE__);
        continue;
      }
      auto add = [&](const std::string& ext, size_t size) {
        SampleMember m;
        m.extension = ext;
        m.name = s.key + "." + ext;
        m.data_begin = s.data.size();
        m.data_size = size;
        s.data.insert(s.data.end(), size, static_cast<uint8_t>(id == bad_ ? 0xEE : id % 200));
        s.payload_bytes += size;
        s.members.push_back(m);
      };
      add("v", static_cast<size_t>(id % 3 + 1));
      if (id % 2 == 0) add("w", 1);
    }
  }

  SampleLocation location(const EncodedSample& sample, const SampleMember* member) const override {
    return {"fake '" + (member != nullptr ? member->name : sample.key) + "'",
            {"fake", member != nullptr ? member->name : "", sample.key}};
  }

 private:
  int64_t n_;
  int64_t unreadable_;
  int64_t bad_;
};

// Copies the member's bytes; 0xEE in the first byte is a bad header.
class CopyDecoder final : public FieldDecoder {
 public:
  void probe(const uint8_t* data, size_t size, ProbedField& out) const override {
    CHUTE_CHECK(size == 0 || data[0] != 0xEE, kData, "bad header");
    out.dtype = DType::kU8;
    out.shape = {static_cast<int64_t>(size)};
  }
  void decode(const uint8_t* data, size_t size, const ProbedField&, const RowPosition&,
              uint8_t* out) const override {
    std::memcpy(out, data, size);
  }
};

// Writes the row's position as the decoders see it: (batch, row, epoch).
class PositionDecoder final : public FieldDecoder {
 public:
  void probe(const uint8_t*, size_t, ProbedField& out) const override {
    out.dtype = DType::kI64;
    out.shape = {3};
  }
  void decode(const uint8_t*, size_t, const ProbedField&, const RowPosition& at,
              uint8_t* out) const override {
    const int64_t values[3] = {at.batch, static_cast<int64_t>(at.row), at.epoch};
    std::memcpy(out, values, sizeof values);
  }
};

FieldPlan field(const std::string& name, const std::string& ext,
                std::shared_ptr<const FieldDecoder> decoder, bool optional = false) {
  FieldPlan f;
  f.name = name;
  f.extensions = {ext};
  f.decoder = std::move(decoder);
  f.optional = optional;
  return f;
}

IndexedPlan sample_plan(std::shared_ptr<const IndexedSampleSource> samples, ErrorPolicy policy,
                        int threads = 2) {
  IndexedPlan plan;
  plan.samples = std::move(samples);
  plan.decoding.fields = {field("v", "v", std::make_shared<CopyDecoder>()),
                          field("at", "v", std::make_shared<PositionDecoder>())};
  plan.decoding.on_error = policy;
  plan.num_threads = threads;
  plan.max_in_flight = 2;
  return plan;
}

Batch next_batch(IndexedEngine& engine) {
  Batch b;
  EXPECT_EQ(engine.next(&b, 30.0), OrderedResults::Status::kBatch);
  return b;
}

std::vector<int64_t> i64_row(const Tensor& t, size_t row, size_t width) {
  const auto* p = reinterpret_cast<const int64_t*>(t.data()) + row * width;
  return std::vector<int64_t>(p, p + width);
}

TEST(IndexedEngineSamples, RowsInSubmissionOrderStackedWhenTheyAgree) {
  IndexedEngine engine(sample_plan(std::make_shared<FakeSamples>(30), ErrorPolicy::kRaise));
  EXPECT_EQ(engine.num_rows(), 30);
  const std::vector<int64_t> same_size{9, 0, 27, 3};  // i % 3 == 0: one byte each
  engine.submit(same_size.data(), same_size.size(), 4);
  const Batch b = next_batch(engine);
  ASSERT_EQ(b.size, 4);
  EXPECT_EQ(b.keys, (std::vector<std::string>{"k9", "k0", "k27", "k3"}));
  ASSERT_EQ(b.columns[0].kind, ColumnKind::kStacked);
  EXPECT_EQ(b.columns[0].stacked.shape, (std::vector<int64_t>{4, 1}));
  const uint8_t* v = b.columns[0].stacked.data();
  EXPECT_EQ(std::vector<int>(v, v + 4), (std::vector<int>{9, 0, 27, 3}));
  // A decoder's random draws follow the sample (its id), never its place.
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(i64_row(b.columns[1].stacked, r, 3), (std::vector<int64_t>{same_size[r], 0, 4}));
  }
}

TEST(IndexedEngineSamples, UnevenShapesBecomeAListForThatBatch) {
  IndexedEngine engine(sample_plan(std::make_shared<FakeSamples>(30), ErrorPolicy::kRaise, 1));
  const std::vector<int64_t> mixed{1, 2, 4};  // 2, 3 and 2 bytes
  engine.submit(mixed.data(), mixed.size());
  const Batch b = next_batch(engine);
  ASSERT_EQ(b.columns[0].kind, ColumnKind::kList);
  ASSERT_EQ(b.columns[0].items.size(), 3u);
  EXPECT_EQ(b.columns[0].items[1].shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(b.columns[0].items[2].data()[1], 4);
  EXPECT_EQ(b.columns[1].kind, ColumnKind::kStacked);  // its rows all agree
}

TEST(IndexedEngineSamples, OptionalFieldsMarkAbsentRows) {
  IndexedPlan plan = sample_plan(std::make_shared<FakeSamples>(10), ErrorPolicy::kRaise);
  plan.decoding.fields = {field("w", "w", std::make_shared<CopyDecoder>(), /*optional=*/true)};
  plan.decoding.keep_other_members = true;
  IndexedEngine engine(std::move(plan));
  const std::vector<int64_t> ids{2, 3};
  engine.submit(ids.data(), ids.size());
  const Batch b = next_batch(engine);
  EXPECT_EQ(b.columns[0].present, (std::vector<uint8_t>{1, 0}));
  ASSERT_EQ(b.other_members.size(), 2u);
  ASSERT_EQ(b.other_members[1].size(), 1u);
  EXPECT_EQ(b.other_members[1][0].first, "v");
}

TEST(IndexedEngineSamples, RaiseFailsTheBatchWithItsFirstBadRow) {
  IndexedEngine engine(sample_plan(std::make_shared<FakeSamples>(30, 20, 13), ErrorPolicy::kRaise));
  const std::vector<int64_t> ids{3, 20, 13};
  engine.submit(ids.data(), ids.size());
  Batch b;
  const std::optional<Error> e = test::error_from([&] { engine.next(&b, 30.0); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kIo);
  EXPECT_EQ(e->message(), "fake 'k20': cannot read");
  // Rethrown from the worker thread that read it, with its scope and place.
  EXPECT_EQ(e->scope(), ErrorScope::kRead);
  EXPECT_EQ(e->place().url, "fake");
  EXPECT_EQ(e->place().key, "k20");
  // The engine goes on with the next batch.
  const std::vector<int64_t> good{0};
  engine.submit(good.data(), good.size());
  EXPECT_EQ(next_batch(engine).size, 1);
}

TEST(IndexedEngineSamples, SkipDropsBadRowsAndCountsThem) {
  IndexedEngine engine(sample_plan(std::make_shared<FakeSamples>(30, 20, 13), ErrorPolicy::kSkip));
  const std::vector<int64_t> ids{3, 20, 13, 6};
  engine.submit(ids.data(), ids.size());
  const Batch b = next_batch(engine);
  EXPECT_EQ(b.keys, (std::vector<std::string>{"k3", "k6"}));
  EXPECT_EQ(b.columns[0].stacked.shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(i64_row(b.columns[1].stacked, 1, 3)[0], 6);
  EXPECT_EQ(engine.stats().samples_skipped, 2u);
  const std::vector<SkippedSample> skipped = engine.take_skipped();
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0].error.message(), "fake 'k20': cannot read");
  EXPECT_EQ(skipped[1].error.kind(), ErrorKind::kData);
  EXPECT_EQ(skipped[1].error.message(), "fake 'k13.v': bad header");
  // Which samples they were comes as data, whatever the messages say.
  EXPECT_EQ(skipped[0].index, 20);
  EXPECT_EQ(skipped[0].offset, 2000);
  EXPECT_EQ(skipped[1].index, 13);
  EXPECT_EQ(skipped[1].source, 0);
  EXPECT_EQ(skipped[1].offset, 1300);
  // And so do what they are about and where: a read, a member that does
  // not decode.
  EXPECT_EQ(skipped[0].error.scope(), ErrorScope::kRead);
  EXPECT_EQ(skipped[0].error.place().key, "k20");
  EXPECT_EQ(skipped[1].error.scope(), ErrorScope::kMember);
  EXPECT_EQ(skipped[1].error.place().url, "fake");
  EXPECT_EQ(skipped[1].error.place().member, "k13.v");
  EXPECT_EQ(skipped[1].error.place().key, "k13");
}

TEST(IndexedEngineSamples, OutOfRangeIdIsAUsageErrorAtItsBatch) {
  IndexedEngine engine(sample_plan(std::make_shared<FakeSamples>(5), ErrorPolicy::kSkip));
  const std::vector<int64_t> ids{1, 5};
  engine.submit(ids.data(), ids.size());
  Batch b;
  const std::optional<Error> e = test::error_from([&] { engine.next(&b, 30.0); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(),
            "index 5 is out of range for a dataset of length 5 (position 1 of batch 0)");
}

TEST(IndexedEngineSamples, ManyBatchesOnManyThreadsKeepTheirOrder) {
  IndexedEngine engine(sample_plan(std::make_shared<FakeSamples>(1000), ErrorPolicy::kRaise, 4));
  std::vector<std::vector<int64_t>> submitted;
  for (int64_t k = 0; k < 20; ++k) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 37; ++i) ids.push_back((k * 97 + i * 31) % 1000);
    submitted.push_back(ids);
  }
  size_t received = 0;
  for (const auto& ids : submitted) {
    engine.submit(ids.data(), ids.size());
    if (engine.outstanding() >= 3) {
      const Batch b = next_batch(engine);
      for (size_t r = 0; r < ids.size(); ++r) {
        EXPECT_EQ(b.keys[r], "k" + std::to_string(submitted[received][r]));
      }
      ++received;
    }
  }
  while (received < submitted.size()) {
    const Batch b = next_batch(engine);
    EXPECT_EQ(b.keys.front(), "k" + std::to_string(submitted[received].front()));
    ++received;
  }
}

TEST(IndexedEngineRows, WithoutSourcesTheDeclaredRowsBoundTheIndices) {
  IndexedPlan plan;
  plan.num_rows = 4;
  IndexedEngine engine(std::move(plan));
  EXPECT_EQ(engine.num_rows(), 4);
  const std::vector<int64_t> ids{0, 3};
  engine.submit(ids.data(), ids.size());
  EXPECT_TRUE(next_batch(engine).columns.empty());
  const std::vector<int64_t> past{4};
  engine.submit(past.data(), past.size());
  Batch b;
  const std::optional<Error> e = test::error_from([&] { engine.next(&b, 30.0); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(),
            "index 4 is out of range for a dataset of length 4 (position 0 of batch 1)");
}

TEST(IndexedEngineThreadless, NextMakesEachBatchInSubmissionOrder) {
  IndexedEngine engine(sample_plan(std::make_shared<FakeSamples>(100), ErrorPolicy::kRaise, 0));
  const std::vector<int64_t> first{5, 7, 9};
  const std::vector<int64_t> second{2, 4};
  engine.submit(first.data(), first.size());
  engine.submit(nullptr, 0);  // delivered when submitted, behind the first
  engine.submit(second.data(), second.size());
  EXPECT_EQ(next_batch(engine).keys, (std::vector<std::string>{"k5", "k7", "k9"}));
  EXPECT_EQ(next_batch(engine).size, 0);
  EXPECT_EQ(next_batch(engine).keys, (std::vector<std::string>{"k2", "k4"}));
  EXPECT_EQ(engine.outstanding(), 0);
}

TEST(IndexedEngineThreadless, AFailedBatchRaisesAtItsPosition) {
  IndexedEngine engine(
      sample_plan(std::make_shared<FakeSamples>(100, 6), ErrorPolicy::kRaise, 0));
  const std::vector<int64_t> good{1};
  const std::vector<int64_t> bad{6};
  engine.submit(good.data(), good.size());
  engine.submit(bad.data(), bad.size());
  engine.submit(good.data(), good.size());
  EXPECT_EQ(next_batch(engine).keys.front(), "k1");
  Batch b;
  const std::optional<Error> e = test::error_from([&] { engine.next(&b, 30.0); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "fake 'k6': cannot read");
  EXPECT_EQ(next_batch(engine).keys.front(), "k1");
}

TEST(IndexedEngineThreadless, GatherIsSubmitAndNextInOneCall) {
  IndexedEngine engine(sample_plan(std::make_shared<FakeSamples>(100), ErrorPolicy::kRaise, 0));
  const std::vector<int64_t> ids{3, 8};
  Batch b;
  engine.gather(ids.data(), ids.size(), &b);
  EXPECT_EQ(b.keys, (std::vector<std::string>{"k3", "k8"}));
  engine.submit(ids.data(), ids.size());
  std::optional<Error> e = test::error_from([&] { engine.gather(ids.data(), ids.size(), &b); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "gather() with batches submitted and not yet returned");

  IndexedEngine threaded(sample_plan(std::make_shared<FakeSamples>(100), ErrorPolicy::kRaise, 1));
  e = test::error_from([&] { threaded.gather(ids.data(), ids.size(), &b); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "gather() is for an engine without threads");
}

// Two blocks of 4 rows, column "c0" of one byte per row (the row's id).
struct Blocks {
  std::string bytes0{0, 1, 2, 3}, bytes1{4, 5, 6, 7};
  std::vector<int64_t> offsets{0, 1, 2, 3, 4};
  std::shared_ptr<BlockSampleSource> source = std::make_shared<BlockSampleSource>(
      std::vector<std::string>{"c0"}, std::vector<std::string>{"v"},
      std::vector<int64_t>{0, 4, 8}, std::vector<std::string>{"group 0", "group 1"},
      std::vector<std::string>{"f", "f"});
  BlockColumn column(const std::string& b) const {
    return BlockColumn{reinterpret_cast<const uint8_t*>(b.data()), b.size(), offsets.data(),
                       nullptr};
  }
  IndexedPlan plan(ErrorPolicy policy) const {
    IndexedPlan p;
    p.samples = source;
    p.decoding.fields = {field("v", "c0", std::make_shared<CopyDecoder>())};
    p.decoding.on_error = policy;
    p.num_threads = 2;
    p.max_in_flight = 4;
    return p;
  }
};

TEST(IndexedEngineBlocks, AFailedBlockRaisesAtItsBatchAfterTheGoodOnes) {
  Blocks blocks;
  IndexedEngine engine(blocks.plan(ErrorPolicy::kRaise));
  blocks.source->expect(0);
  blocks.source->expect(1);
  const std::vector<int64_t> first{0, 1}, second{2, 3}, third{4, 5};
  engine.submit(first.data(), first.size());
  engine.submit(second.data(), second.size());
  engine.submit(third.data(), third.size());
  // The later block settles first: its failure waits for its batch.
  blocks.source->fail(1, Error(ErrorKind::kData, "group 1: corrupt", __FILE__, __LINE__));
  blocks.source->put(0, {blocks.column(blocks.bytes0)}, nullptr);
  EXPECT_EQ(next_batch(engine).keys, (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(next_batch(engine).keys, (std::vector<std::string>{"2", "3"}));
  Batch b;
  const std::optional<Error> e = test::error_from([&] { engine.next(&b, 30.0); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "group 1: corrupt");
  EXPECT_EQ(e->scope(), ErrorScope::kRead);
  EXPECT_EQ(e->place().key, "4");
}

TEST(IndexedEngineBlocks, SkippingDropsExactlyTheRowsOfTheFailedBlock) {
  Blocks blocks;
  IndexedEngine engine(blocks.plan(ErrorPolicy::kSkip));
  blocks.source->put(0, {blocks.column(blocks.bytes0)}, nullptr);
  blocks.source->fail(1, Error(ErrorKind::kIo, "group 1: gone", __FILE__, __LINE__));
  const std::vector<int64_t> ids{3, 4, 0, 7};
  engine.submit(ids.data(), ids.size());
  EXPECT_EQ(next_batch(engine).keys, (std::vector<std::string>{"3", "0"}));
  const std::vector<SkippedSample> skipped = engine.take_skipped();
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0].error.message(), "group 1: gone");
}

TEST(IndexedEngineBlocks, AWaitForABlockKeepsTheTimeoutAndEndsAtClose) {
  Blocks blocks;
  IndexedEngine engine(blocks.plan(ErrorPolicy::kRaise));
  blocks.source->expect(0);  // never put: a stalled read
  const std::vector<int64_t> ids{0, 1};
  engine.submit(ids.data(), ids.size());
  Batch b;
  EXPECT_EQ(engine.next(&b, 0.05), OrderedResults::Status::kTimeout);
  // Joins the workers, one of them waiting for block 0: without the
  // cancel, this would wait for ever (ctest's timeout).
  engine.close();
}

}  // namespace
}  // namespace chute

#include "batching/stream_batch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "batching/stream_batch_testing.h"
#include "core/error.h"
#include "core/testing.h"
#include "sources/sample_testing.h"

namespace chute {
namespace {

using test::BatchRun;
using test::encoded_sample;

FieldPlan field(const std::string& name, const std::string& extension,
                std::shared_ptr<const FieldDecoder> decoder, bool optional = false,
                bool stack = true) {
  FieldPlan f;
  f.name = name;
  f.extensions = {extension};
  f.decoder = std::move(decoder);
  f.optional = optional;
  f.stack = stack;
  return f;
}

std::vector<uint8_t> row_bytes(const Tensor& t, size_t row) {
  const size_t n = t.nbytes() / static_cast<size_t>(t.shape[0]);
  return std::vector<uint8_t>(t.data() + row * n, t.data() + (row + 1) * n);
}

std::vector<int64_t> i64_row(const Tensor& t, size_t row) {
  const size_t n = t.numel() / static_cast<size_t>(t.shape[0]);
  const auto* v = reinterpret_cast<const int64_t*>(t.data());
  return std::vector<int64_t>(v + row * n, v + (row + 1) * n);
}

TEST(StreamBatch, DecodesSamplesIntoStackedColumns) {
  BatchRun r;
  r.plan.seed = 11;
  r.plan.epoch = 2;
  r.plan.fields = {field("digits", "dig", std::make_shared<test::DigitsDecoder>()),
                   field("where", "dig", std::make_shared<test::PositionDecoder>())};
  const std::optional<Batch> b = r.run({encoded_sample("a", {{"dig", "1234"}}, 1),
                                        encoded_sample("b", {{"txt", "x"}, {"dig", "5678"}}, 0),
                                        encoded_sample("c", {{"dig", "9012"}}, 1)},
                                       /*absolute=*/7);
  ASSERT_TRUE(b) << r.error->what();
  EXPECT_EQ(b->sequence, 0);
  ASSERT_EQ(b->size, 3);
  ASSERT_EQ(b->columns.size(), 2u);
  const Column& digits = b->columns[0];
  EXPECT_EQ(digits.kind, ColumnKind::kStacked);
  EXPECT_EQ(digits.stacked.dtype, DType::kU8);
  EXPECT_EQ(digits.stacked.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(digits.present.empty());
  EXPECT_EQ(row_bytes(digits.stacked, 0), (std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_EQ(row_bytes(digits.stacked, 1), (std::vector<uint8_t>{5, 6, 7, 8}));
  EXPECT_EQ(row_bytes(digits.stacked, 2), (std::vector<uint8_t>{9, 0, 1, 2}));
  // Each row decoded knowing where it is: {seed, epoch, batch, row, field}.
  const Column& where = b->columns[1];
  EXPECT_EQ(where.stacked.dtype, DType::kI64);
  EXPECT_EQ(where.stacked.shape, (std::vector<int64_t>{3, 5}));
  for (size_t row = 0; row < 3; ++row) {
    EXPECT_EQ(i64_row(where.stacked, row), (std::vector<int64_t>{11, 2, 7, int64_t(row), 1}));
  }
  EXPECT_EQ(b->keys, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(b->source_index, (std::vector<uint32_t>{1, 0, 1}));
  EXPECT_TRUE(b->other_members.empty());
  EXPECT_EQ(r.skips.count(), 0u);
}

TEST(StreamBatch, ListBytesOptionalAndLeftoverMembers) {
  BatchRun r;
  r.plan.collect_keys = false;
  r.plan.keep_other_members = true;
  const auto digits = std::make_shared<test::DigitsDecoder>();
  r.plan.fields = {field("tokens", "tok", digits, false, /*stack=*/false),
                   field("meta", "json", nullptr),
                   field("depth", "depth", digits, /*optional=*/true)};
  const std::optional<Batch> b =
      r.run({encoded_sample("a", {{"tok", "1"}, {"json", "{}"}, {"depth", "12"}, {"txt", "hi"}}),
             encoded_sample("b", {{"tok", "234"}, {"json", "[]"}}),
             encoded_sample("c", {{"cls", "7"}, {"tok", "56"}, {"json", "{\"a\":1}"},
                                  {"depth", "34"}})});
  ASSERT_TRUE(b) << r.error->what();
  ASSERT_EQ(b->size, 3);
  const Column& tokens = b->columns[0];
  EXPECT_EQ(tokens.kind, ColumnKind::kList);
  ASSERT_EQ(tokens.items.size(), 3u);
  const std::vector<std::vector<uint8_t>> expected_tokens = {{1}, {2, 3, 4}, {5, 6}};
  for (size_t i = 0; i < 3; ++i) {
    const Tensor& t = tokens.items[i];
    EXPECT_EQ(t.shape, (std::vector<int64_t>{int64_t(expected_tokens[i].size())}));
    EXPECT_EQ(std::vector<uint8_t>(t.data(), t.data() + t.nbytes()), expected_tokens[i]);
  }
  const Column& meta = b->columns[1];
  EXPECT_EQ(meta.kind, ColumnKind::kBytes);
  EXPECT_EQ(meta.raw, (std::vector<std::string>{"{}", "[]", "{\"a\":1}"}));
  const Column& depth = b->columns[2];
  EXPECT_EQ(depth.kind, ColumnKind::kStacked);
  EXPECT_EQ(depth.stacked.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(depth.present, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(row_bytes(depth.stacked, 0), (std::vector<uint8_t>{1, 2}));
  EXPECT_EQ(row_bytes(depth.stacked, 1), (std::vector<uint8_t>{0, 0}));  // absent: zeros
  EXPECT_EQ(row_bytes(depth.stacked, 2), (std::vector<uint8_t>{3, 4}));
  EXPECT_TRUE(b->keys.empty());
  using Others = std::vector<std::pair<std::string, std::string>>;
  ASSERT_EQ(b->other_members.size(), 3u);
  EXPECT_EQ(b->other_members[0], (Others{{"txt", "hi"}}));
  EXPECT_EQ(b->other_members[1], Others{});
  EXPECT_EQ(b->other_members[2], (Others{{"cls", "7"}}));
}

TEST(StreamBatch, AnOptionalFieldAbsentFromTheFirstRowTakesItsShapeFromAPresentOne) {
  BatchRun r;
  r.plan.fields = {field("depth", "depth", std::make_shared<test::DigitsDecoder>(), true)};
  const std::optional<Batch> b = r.run({encoded_sample("a", {{"txt", "x"}}),
                                        encoded_sample("b", {{"depth", "123"}}),
                                        encoded_sample("c", {{"depth", "456"}})});
  ASSERT_TRUE(b) << r.error->what();
  const Column& depth = b->columns[0];
  EXPECT_EQ(depth.stacked.dtype, DType::kU8);
  EXPECT_EQ(depth.stacked.shape, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(depth.present, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(row_bytes(depth.stacked, 0), (std::vector<uint8_t>{0, 0, 0}));
  EXPECT_EQ(row_bytes(depth.stacked, 2), (std::vector<uint8_t>{4, 5, 6}));
}

TEST(StreamBatch, UnderSkipAFailingRowIsDroppedAndTheBatchCompacted) {
  BatchRun r;
  r.plan.on_error = ErrorPolicy::kSkip;
  r.plan.keep_other_members = true;
  r.plan.fields = {field("digits", "dig", std::make_shared<test::DigitsDecoder>()),
                   field("meta", "json", nullptr)};
  const std::optional<Batch> b =
      r.run({encoded_sample("a", {{"dig", "11"}, {"json", "A"}, {"t", "0"}}, 0),
             encoded_sample("b", {{"dig", "2x"}, {"json", "B"}, {"t", "1"}}, 1),
             encoded_sample("c", {{"dig", "33"}, {"json", "C"}, {"t", "2"}}, 0),
             encoded_sample("d", {{"dig", "y4"}, {"json", "D"}, {"t", "3"}}, 1),
             encoded_sample("e", {{"dig", "55"}, {"json", "E"}, {"t", "4"}}, 1)});
  ASSERT_TRUE(b) << r.error->what();
  ASSERT_EQ(b->size, 3);
  EXPECT_EQ(b->columns[0].stacked.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(row_bytes(b->columns[0].stacked, 0), (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(row_bytes(b->columns[0].stacked, 1), (std::vector<uint8_t>{3, 3}));
  EXPECT_EQ(row_bytes(b->columns[0].stacked, 2), (std::vector<uint8_t>{5, 5}));
  EXPECT_EQ(b->columns[1].raw, (std::vector<std::string>{"A", "C", "E"}));
  EXPECT_EQ(b->keys, (std::vector<std::string>{"a", "c", "e"}));
  EXPECT_EQ(b->source_index, (std::vector<uint32_t>{0, 0, 1}));
  using Others = std::vector<std::pair<std::string, std::string>>;
  ASSERT_EQ(b->other_members.size(), 3u);
  EXPECT_EQ(b->other_members[1], (Others{{"t", "2"}}));
  // Both failures were recorded for the handler, with where they happened.
  EXPECT_EQ(r.skips.count(), 2u);
  const std::vector<SkippedSample> skipped = r.skips.take();
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0].error.kind(), ErrorKind::kData);
  EXPECT_EQ(skipped[0].error.message(), "s1.tar sample 'b' member 'b.dig': not a digit: 'x'");
  EXPECT_STREQ(skipped[0].error.file(), "sample_testing.h");
  EXPECT_EQ(skipped[1].error.message(), "s1.tar sample 'd' member 'd.dig': not a digit: 'y'");
  // A stream's samples have no id; their shard is known.
  EXPECT_EQ(skipped[0].index, -1);
  EXPECT_EQ(skipped[0].source, 1);
  EXPECT_EQ(skipped[1].source, 1);
}

TEST(StreamBatch, UnderSkipEveryRowMayFail) {
  BatchRun r;
  r.plan.on_error = ErrorPolicy::kSkip;
  r.plan.fields = {field("digits", "dig", std::make_shared<test::DigitsDecoder>())};
  const std::optional<Batch> b =
      r.run({encoded_sample("a", {{"dig", "x"}}), encoded_sample("b", {{"dig", "y"}})});
  ASSERT_TRUE(b) << r.error->what();
  EXPECT_EQ(b->size, 0);
  EXPECT_EQ(b->columns[0].stacked.shape, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(b->keys.empty());
  EXPECT_EQ(r.skips.count(), 2u);
}

// Big enough payloads that a batch is cut into several pieces.
std::string digits_of(size_t n, char c) { return std::string(n, c); }

class StreamBatchRaise : public ::testing::TestWithParam<int> {};

TEST_P(StreamBatchRaise, TheBatchFailsWithItsFirstFailingRow) {
  const int workers = GetParam();
  for (size_t payload : {size_t{3}, size_t{30000}}) {  // one piece, then pieces of two rows
    SCOPED_TRACE(payload);
    BatchRun r;
    r.plan.fields = {field("digits", "dig", std::make_shared<test::DigitsDecoder>())};
    std::vector<EncodedSample> samples;
    for (int i = 0; i < 8; ++i) {
      std::string body = digits_of(payload, static_cast<char>('0' + i));
      if (i == 3 || i == 6) body.back() = static_cast<char>('a' + i);
      samples.push_back(encoded_sample("k" + std::to_string(i), {{"dig", body}}, 1));
    }
    EXPECT_FALSE(r.run(std::move(samples), 0, workers));
    ASSERT_TRUE(r.error);
    EXPECT_EQ(r.error->kind(), ErrorKind::kData);
    EXPECT_EQ(r.error->message(), "s1.tar sample 'k3' member 'k3.dig': not a digit: 'd'");
    EXPECT_EQ(r.skips.count(), 0u);  // raising records nothing for a handler
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, StreamBatchRaise, ::testing::Values(1, 3));

TEST(StreamBatch, ASampleWhoseBytesWereLostIsDroppedUnderSkip) {
  BatchRun r;
  r.plan.on_error = ErrorPolicy::kSkip;
  r.plan.fields = {field("digits", "dig", std::make_shared<test::DigitsDecoder>())};
  std::shared_ptr<test::TestStorage> storage;
  std::vector<EncodedSample> samples = test::in_place_samples(
      {{"a", {{"dig", "12"}}}, {"b", {{"dig", "34"}}}, {"c", {{"dig", "56"}}}}, &storage);
  storage->lose("b");  // cut away after it was read: its row decoded, but not from its bytes
  const std::optional<Batch> b = r.run(std::move(samples));
  ASSERT_TRUE(b) << r.error->what();
  ASSERT_EQ(b->size, 2);
  EXPECT_EQ(b->keys, (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(row_bytes(b->columns[0].stacked, 1), (std::vector<uint8_t>{5, 6}));
  const std::vector<SkippedSample> skipped = r.skips.take();
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].error.kind(), ErrorKind::kIo);
  EXPECT_EQ(skipped[0].error.message(), "sample 'b' was cut from the shard");
  // The batch is done with the storage: the three samples' range (one run of
  // the shard, 6 payload bytes) may leave memory.
  EXPECT_EQ(storage->released(), (std::vector<std::pair<uint64_t, uint64_t>>{{0, 6}}));
}

TEST(StreamBatch, ASampleWhoseBytesWereLostFailsTheBatchUnderRaise) {
  BatchRun r;
  r.plan.fields = {field("digits", "dig", std::make_shared<test::DigitsDecoder>())};
  std::shared_ptr<test::TestStorage> storage;
  std::vector<EncodedSample> samples = test::in_place_samples(
      {{"a", {{"dig", "12"}}}, {"b", {{"dig", "34"}}}, {"c", {{"dig", "56"}}}}, &storage);
  storage->lose("c");
  storage->lose("b");
  EXPECT_FALSE(r.run(std::move(samples)));
  ASSERT_TRUE(r.error);
  EXPECT_EQ(r.error->kind(), ErrorKind::kIo);
  EXPECT_EQ(r.error->message(), "sample 'b' was cut from the shard");
}

TEST(StreamBatch, IntactInPlaceSamplesReleaseTheirRangesWhenTheBatchIsDone) {
  BatchRun r;
  r.plan.fields = {field("digits", "dig", std::make_shared<test::DigitsDecoder>())};
  std::shared_ptr<test::TestStorage> first;
  std::shared_ptr<test::TestStorage> second;
  std::vector<EncodedSample> a =
      test::in_place_samples({{"a0", {{"dig", "1"}}}, {"a1", {{"dig", "2"}, {"x", "zz"}}}}, &first);
  std::vector<EncodedSample> b = test::in_place_samples({{"b0", {{"dig", "3"}}}}, &second);
  std::vector<EncodedSample> samples;
  samples.push_back(std::move(a[0]));
  samples.push_back(std::move(a[1]));
  samples.push_back(std::move(b[0]));
  const std::optional<Batch> batch = r.run(std::move(samples));
  ASSERT_TRUE(batch) << r.error->what();
  EXPECT_EQ(row_bytes(batch->columns[0].stacked, 2), (std::vector<uint8_t>{3}));
  EXPECT_EQ(first->released(), (std::vector<std::pair<uint64_t, uint64_t>>{{0, 4}}));
  EXPECT_EQ(second->released(), (std::vector<std::pair<uint64_t, uint64_t>>{{0, 1}}));
}

TEST(StreamBatch, ADecodedBatchGivesItsPayloadBuffersBack) {
  BatchRun r;
  r.plan.fields = {field("digits", "dig", std::make_shared<test::DigitsDecoder>())};
  ASSERT_TRUE(r.run({encoded_sample("a", {{"dig", "12"}}), encoded_sample("b", {{"dig", "34"}})}));
  for (int i = 0; i < 2; ++i) {
    const std::vector<uint8_t> buffer = r.payload_buffers.take();
    EXPECT_TRUE(buffer.empty());
    EXPECT_GE(buffer.capacity(), 2u) << "buffer " << i;
  }
  EXPECT_EQ(r.payload_buffers.take().capacity(), 0u);  // no more than the samples held
}

}  // namespace
}  // namespace chute

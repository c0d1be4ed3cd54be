#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "batching/batch.h"
#include "memory/batch_allocator.h"

namespace chute {
namespace {

constexpr int64_t kRows = 5;

// A batch of kRows rows with every kind of column, each row's values derived
// from its row number r, so a row can be recognised wherever it ends up:
//   0: stacked int32 [B, 3] holding r*10, r*10+1, r*10+2
//   1: list of uint8 tensors, row r of length r+1 filled with r
//   2: bytes "row<r>"
//   3: stacked uint8 [B] holding 100+r, present only for even rows
// keys "k<r>", source_index 7*r, other_members {("txt", "t<r>")}.
Batch make_batch(BatchAllocator& allocator) {
  Batch b;
  b.sequence = 3;
  b.size = kRows;
  Column stacked;
  stacked.kind = ColumnKind::kStacked;
  stacked.stacked = make_tensor(allocator, DType::kI32, {kRows, 3});
  auto* s = reinterpret_cast<int32_t*>(stacked.stacked.data());
  for (int32_t r = 0; r < kRows; ++r) {
    for (int32_t c = 0; c < 3; ++c) s[r * 3 + c] = r * 10 + c;
  }
  b.columns.push_back(std::move(stacked));

  Column list;
  list.kind = ColumnKind::kList;
  for (int64_t r = 0; r < kRows; ++r) {
    Tensor t = make_tensor(allocator, DType::kU8, {r + 1});
    std::memset(t.data(), static_cast<int>(r), t.nbytes());
    list.items.push_back(std::move(t));
  }
  b.columns.push_back(std::move(list));

  Column bytes;
  bytes.kind = ColumnKind::kBytes;
  for (int64_t r = 0; r < kRows; ++r) bytes.raw.push_back("row" + std::to_string(r));
  b.columns.push_back(std::move(bytes));

  Column optional;
  optional.kind = ColumnKind::kStacked;
  optional.stacked = make_tensor(allocator, DType::kU8, {kRows});
  for (int64_t r = 0; r < kRows; ++r) {
    optional.stacked.data()[r] = static_cast<uint8_t>(100 + r);
    optional.present.push_back(r % 2 == 0 ? 1 : 0);
  }
  b.columns.push_back(std::move(optional));

  for (int64_t r = 0; r < kRows; ++r) {
    b.keys.push_back("k" + std::to_string(r));
    b.source_index.push_back(static_cast<uint32_t>(7 * r));
    b.other_members.push_back({{"txt", "t" + std::to_string(r)}});
  }
  return b;
}

// Checks that `b` holds exactly the rows `kept` of make_batch, in that order.
void expect_rows(const Batch& b, const std::vector<int>& kept) {
  const auto n = static_cast<int64_t>(kept.size());
  EXPECT_EQ(b.sequence, 3);
  ASSERT_EQ(b.size, n);
  ASSERT_EQ(b.columns.size(), 4u);

  const Column& stacked = b.columns[0];
  EXPECT_EQ(stacked.kind, ColumnKind::kStacked);
  EXPECT_EQ(stacked.stacked.shape, (std::vector<int64_t>{n, 3}));
  EXPECT_EQ(stacked.stacked.nbytes(), static_cast<size_t>(n) * 3 * sizeof(int32_t));
  EXPECT_TRUE(stacked.present.empty());
  const auto* s = reinterpret_cast<const int32_t*>(stacked.stacked.data());
  for (size_t i = 0; i < kept.size(); ++i) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(s[i * 3 + c], kept[i] * 10 + c) << "row " << i;
  }

  const Column& list = b.columns[1];
  EXPECT_EQ(list.kind, ColumnKind::kList);
  ASSERT_EQ(list.items.size(), kept.size());
  EXPECT_TRUE(list.raw.empty());
  for (size_t i = 0; i < kept.size(); ++i) {
    const Tensor& t = list.items[i];
    ASSERT_NE(t.block, nullptr) << "row " << i;
    EXPECT_EQ(t.shape, (std::vector<int64_t>{kept[i] + 1})) << "row " << i;
    for (size_t k = 0; k < t.nbytes(); ++k) EXPECT_EQ(t.data()[k], kept[i]) << "row " << i;
  }

  const Column& bytes = b.columns[2];
  EXPECT_EQ(bytes.kind, ColumnKind::kBytes);
  EXPECT_TRUE(bytes.items.empty());
  ASSERT_EQ(bytes.raw.size(), kept.size());
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(bytes.raw[i], "row" + std::to_string(kept[i]));

  const Column& optional = b.columns[3];
  EXPECT_EQ(optional.stacked.shape, (std::vector<int64_t>{n}));
  ASSERT_EQ(optional.present.size(), kept.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(optional.stacked.data()[i], 100 + kept[i]) << "row " << i;
    EXPECT_EQ(optional.present[i], kept[i] % 2 == 0 ? 1 : 0) << "row " << i;
  }

  ASSERT_EQ(b.keys.size(), kept.size());
  ASSERT_EQ(b.source_index.size(), kept.size());
  ASSERT_EQ(b.other_members.size(), kept.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(b.keys[i], "k" + std::to_string(kept[i]));
    EXPECT_EQ(b.source_index[i], static_cast<uint32_t>(7 * kept[i]));
    const std::vector<std::pair<std::string, std::string>> others = {
        {"txt", "t" + std::to_string(kept[i])}};
    EXPECT_EQ(b.other_members[i], others);
  }
}

// The rows of make_batch left once `dropped` (row numbers) are dropped.
std::vector<uint8_t> flags(const std::vector<int>& dropped) {
  std::vector<uint8_t> out(kRows, 0);
  for (int r : dropped) out[static_cast<size_t>(r)] = 1;
  return out;
}

TEST(BatchDropRows, DroppingNoneChangesNothing) {
  BatchAllocator allocator;
  Batch b = make_batch(allocator);
  const uint8_t* stacked_before = b.columns[0].stacked.data();
  b.drop_rows(flags({}));
  expect_rows(b, {0, 1, 2, 3, 4});
  EXPECT_EQ(b.columns[0].stacked.data(), stacked_before);  // compacted in place, not copied
}

TEST(BatchDropRows, DroppingTheFirstRowShiftsTheOthersUp) {
  BatchAllocator allocator;
  Batch b = make_batch(allocator);
  b.drop_rows(flags({0}));
  expect_rows(b, {1, 2, 3, 4});
}

TEST(BatchDropRows, DroppingTheLastRowShortensTheBatch) {
  BatchAllocator allocator;
  Batch b = make_batch(allocator);
  b.drop_rows(flags({4}));
  expect_rows(b, {0, 1, 2, 3});
}

TEST(BatchDropRows, DroppingRowsInTheMiddleKeepsTheOthersInOrder) {
  BatchAllocator allocator;
  Batch b = make_batch(allocator);
  b.drop_rows(flags({1, 2}));
  expect_rows(b, {0, 3, 4});
}

TEST(BatchDropRows, DroppingEveryOtherRow) {
  BatchAllocator allocator;
  Batch b = make_batch(allocator);
  b.drop_rows(flags({0, 2, 4}));
  expect_rows(b, {1, 3});
  // Only odd rows are left: the optional field is absent in all of them.
  EXPECT_EQ(b.columns[3].present, (std::vector<uint8_t>{0, 0}));
}

TEST(BatchDropRows, DroppingAllRowsLeavesAnEmptyBatch) {
  BatchAllocator allocator;
  Batch b = make_batch(allocator);
  b.drop_rows(flags({0, 1, 2, 3, 4}));
  expect_rows(b, {});
  EXPECT_EQ(b.tensor_bytes(), 0u);
}

TEST(BatchDropRows, ABatchWithoutKeysOrSourceIndicesKeepsThemEmpty) {
  // Indexed batches carry no keys, and plans without kept members no
  // other_members: compaction must not invent them.
  BatchAllocator allocator;
  Batch b;
  b.size = 3;
  Column c;
  c.stacked = make_tensor(allocator, DType::kI64, {3});
  auto* v = reinterpret_cast<int64_t*>(c.stacked.data());
  for (int64_t r = 0; r < 3; ++r) v[r] = 40 + r;
  b.columns.push_back(std::move(c));
  b.drop_rows({0, 1, 0});
  ASSERT_EQ(b.size, 2);
  EXPECT_EQ(b.columns[0].stacked.shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(v[0], 40);
  EXPECT_EQ(v[1], 42);
  EXPECT_TRUE(b.columns[0].present.empty());
  EXPECT_TRUE(b.keys.empty());
  EXPECT_TRUE(b.source_index.empty());
  EXPECT_TRUE(b.other_members.empty());
}

TEST(BatchDropRows, TensorBytesFollowTheKeptRows) {
  BatchAllocator allocator;
  Batch b = make_batch(allocator);
  // Stacked: 5*3*4 + 5; list: 1+2+3+4+5.
  EXPECT_EQ(b.tensor_bytes(), 60u + 5u + 15u);
  b.drop_rows(flags({1, 4}));
  // Rows 0, 2, 3 left: 3*3*4 + 3, and list rows of 1, 3 and 4 bytes.
  EXPECT_EQ(b.tensor_bytes(), 36u + 3u + 8u);
}

}  // namespace
}  // namespace chute

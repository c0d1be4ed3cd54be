#include "compose/indexed_request.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "tokens/token_file.h"

namespace chute {
namespace {

TEST(IndexedRequest, BlockSamplesAreNamedByTheirColumnsAndBlocks) {
  const std::shared_ptr<BlockSampleSource> source = compose_block_samples(
      {{"jpg"},
       {"image"},
       {0, 2, 5},
       {"file 'a', row group 0", "file 'a', row group 1"},
       {"a", "a"}});
  EXPECT_EQ(source->num_samples(), 5);
  ASSERT_EQ(source->num_blocks(), 2u);
  EXPECT_EQ(source->block_rows(1), 3);
  // A sample of a block not put fails, naming the block.
  const int64_t id = 3;
  EncodedSample sample;
  std::optional<Error> error;
  source->read(&id, 1, &sample, &error);
  ASSERT_TRUE(error);
  EXPECT_NE(error->message().find("row group 1"), std::string::npos) << error->message();
}

std::shared_ptr<const TokenPacker> packer(const test::TempDir& dir, PackMode mode) {
  const std::vector<uint16_t> tokens{0, 1, 2, 3, 4, 5, 6, 7, 8};
  const std::string path = dir.write(
      "t.bin", std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2));
  PackOptions options;
  options.seq_len = 4;
  options.mode = mode;
  options.eod_id = mode == PackMode::kDocuments ? 8 : -1;
  return std::make_shared<TokenPacker>(
      std::vector<std::shared_ptr<const TokenFile>>{
          TokenFile::open(path, TokenFormat::kRaw, DType::kU16)},
      options);
}

TEST(IndexedRequest, TokenFieldsArePickedByName) {
  test::TempDir dir;
  const auto windows = packer(dir, PackMode::kWindows);
  for (const std::string field : {"input_ids", "labels", "position_ids"}) {
    const std::shared_ptr<RowSource> rows = compose_token_field(windows, field);
    EXPECT_EQ(rows->name(), field);
    EXPECT_EQ(rows->row_shape(), std::vector<int64_t>{4}) << field;
  }
  EXPECT_EQ(compose_token_field(windows, "window")->row_shape(), std::vector<int64_t>{5});
}

TEST(IndexedRequest, AnUnknownTokenFieldOrAWindowOfDocumentsIsAUsageError) {
  test::TempDir dir;
  std::optional<Error> e =
      test::error_from([&] { compose_token_field(packer(dir, PackMode::kWindows), "tokens"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(), "no token field 'tokens'");
  e = test::error_from([&] { compose_token_field(packer(dir, PackMode::kDocuments), "window"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(), "the token field 'window' is for windows packing, not documents");
}

}  // namespace
}  // namespace chute

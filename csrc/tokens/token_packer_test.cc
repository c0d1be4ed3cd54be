#include "tokens/token_packer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/testing.h"
#include "tokens/token_file.h"

namespace chute {
namespace {

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::vector<int64_t> row(const TokenPacker& p, TokenField f, int64_t seq) {
  std::vector<int64_t> out(static_cast<size_t>(p.row_tokens(f)));
  p.write(f, seq, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

// A Megatron index for sequences of `lengths` tokens (uint16), contiguous,
// with documents starting at `docs` (ending with the sequence count).
std::string megatron_index(const std::vector<int32_t>& lengths, const std::vector<int64_t>& docs) {
  std::string out("MMIDIDX\0\0", 9);
  const uint64_t version = 1;
  out += bytes_of(std::vector<uint64_t>{version});
  out += std::string(1, '\x08');
  out += bytes_of(std::vector<uint64_t>{lengths.size(), docs.size()});
  out += bytes_of(lengths);
  std::vector<int64_t> pointers;
  int64_t at = 0;
  for (int32_t n : lengths) {
    pointers.push_back(at);
    at += n * 2;
  }
  out += bytes_of(pointers);
  out += bytes_of(docs);
  return out;
}

TEST(TokenPacker, WindowsAreShiftedByOneAndCrossFiles) {
  test::TempDir dir;
  std::vector<uint16_t> a{0, 1, 2, 3, 4}, b{5, 6, 7, 8, 9, 10};
  auto fa = TokenFile::open(dir.write("a.bin", bytes_of(a)), TokenFormat::kRaw, DType::kU16);
  auto fb = TokenFile::open(dir.write("b.bin", bytes_of(b)), TokenFormat::kRaw, DType::kU16);
  PackOptions o;
  o.seq_len = 4;
  TokenPacker p({fa, fb}, o);
  ASSERT_EQ(p.num_sequences(), 2);  // 11 tokens: windows of 5 at 0 and 4
  EXPECT_EQ(row(p, TokenField::kInputIds, 1), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(row(p, TokenField::kLabels, 1), (std::vector<int64_t>{5, 6, 7, 8}));
  EXPECT_EQ(p.unused_tokens(), 3);
}

TEST(TokenPacker, WindowFieldIsInputIdsAndTheLastLabel) {
  test::TempDir dir;
  std::vector<uint16_t> a{0, 1, 2, 3, 4}, b{5, 6, 7, 8, 9, 10};
  auto fa = TokenFile::open(dir.write("a.bin", bytes_of(a)), TokenFormat::kRaw, DType::kU16);
  auto fb = TokenFile::open(dir.write("b.bin", bytes_of(b)), TokenFormat::kRaw, DType::kU16);
  PackOptions o;
  o.seq_len = 4;
  TokenPacker p({fa, fb}, o);
  EXPECT_EQ(p.row_tokens(TokenField::kWindow), 5);
  EXPECT_EQ(row(p, TokenField::kWindow, 0), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(row(p, TokenField::kWindow, 1), (std::vector<int64_t>{4, 5, 6, 7, 8}));

  o.out_dtype = DType::kI32;
  TokenPacker p32({fa, fb}, o);
  std::vector<int32_t> out(5);
  p32.write(TokenField::kWindow, 1, reinterpret_cast<uint8_t*>(out.data()));
  EXPECT_EQ(out, (std::vector<int32_t>{4, 5, 6, 7, 8}));

  o.mode = PackMode::kDocuments;
  o.eod_id = 0;
  TokenPacker docs({fa, fb}, o);
  auto e = test::error_from([&] { row(docs, TokenField::kWindow, 0); });
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("windows packing"), std::string::npos) << e->message();
}

TEST(TokenPacker, DocumentsPackWholeAndSplitOnlyLongOnes) {
  test::TempDir dir;
  // documents (eod 0): [1 2 0] [3 0] [4 5 6 7 8 9 0] [11]
  std::vector<uint32_t> t{1, 2, 0, 3, 0, 4, 5, 6, 7, 8, 9, 0, 11};
  auto f = TokenFile::open(dir.write("t.bin", bytes_of(t)), TokenFormat::kRaw, DType::kU32);
  PackOptions o;
  o.seq_len = 4;
  o.mode = PackMode::kDocuments;
  o.eod_id = 0;
  o.pad_id = 99;
  TokenPacker p({f}, o);
  EXPECT_EQ(p.num_documents(), 4);
  ASSERT_EQ(p.num_sequences(), 4);
  const int64_t I = TokenPacker::kIgnoreLabel;
  EXPECT_EQ(row(p, TokenField::kInputIds, 0), (std::vector<int64_t>{1, 2, 0, 99}));
  EXPECT_EQ(row(p, TokenField::kLabels, 0), (std::vector<int64_t>{2, 0, I, I}));
  // [3 0] does not fit after [1 2 0]; the long document starts its own.
  EXPECT_EQ(row(p, TokenField::kInputIds, 1), (std::vector<int64_t>{3, 0, 99, 99}));
  EXPECT_EQ(row(p, TokenField::kInputIds, 2), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(row(p, TokenField::kLabels, 2), (std::vector<int64_t>{5, 6, 7, 8}));
  EXPECT_EQ(row(p, TokenField::kInputIds, 3), (std::vector<int64_t>{8, 9, 0, 11}));
  EXPECT_EQ(row(p, TokenField::kLabels, 3), (std::vector<int64_t>{9, 0, I, I}));
  EXPECT_EQ(row(p, TokenField::kPositionIds, 3), (std::vector<int64_t>{0, 1, 2, 0}));
  EXPECT_EQ(p.pad_tokens(), 3);
}

TEST(TokenPacker, MegatronDocumentsComeFromTheIndex) {
  test::TempDir dir;
  std::vector<uint16_t> t{1, 2, 3, 4, 5, 6};
  const std::string bin = dir.write("m.bin", bytes_of(t));
  const std::string idx = dir.write("m.idx", megatron_index({2, 1, 3}, {0, 2, 3}));
  auto f = TokenFile::open(bin, TokenFormat::kMegatron, DType::kU16, idx);
  EXPECT_EQ(f->dtype(), DType::kU16);
  PackOptions o;
  o.seq_len = 3;
  o.mode = PackMode::kDocuments;
  TokenPacker p({f}, o);
  EXPECT_EQ(p.document_lengths(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(row(p, TokenField::kInputIds, 1), (std::vector<int64_t>{4, 5, 6}));
}

TEST(TokenPacker, EmptyDocumentsCountAsMegatronCountsThemButPackAsNothing) {
  test::TempDir dir;
  std::vector<uint16_t> t{1, 2, 3, 4, 5, 6};
  const std::string bin = dir.write("m.bin", bytes_of(t));
  // Documents: [1 2] [] (no sequence) [3] [] (an empty sequence) [4 5 6].
  const std::string idx = dir.write("m.idx", megatron_index({2, 1, 0, 3}, {0, 1, 1, 2, 3, 4}));
  auto f = TokenFile::open(bin, TokenFormat::kMegatron, DType::kU16, idx);
  PackOptions o;
  o.seq_len = 3;
  o.mode = PackMode::kDocuments;
  TokenPacker p({f}, o);
  EXPECT_EQ(p.num_documents(), 5);
  EXPECT_EQ(p.document_lengths(), (std::vector<int64_t>{2, 0, 1, 0, 3}));
  ASSERT_EQ(p.num_sequences(), 2);  // [1 2 3] [4 5 6]
  EXPECT_EQ(row(p, TokenField::kInputIds, 0), (std::vector<int64_t>{1, 2, 3}));
  // Packing windows, the index bounds the same documents.
  o.mode = PackMode::kWindows;
  TokenPacker w({f}, o);
  EXPECT_TRUE(w.documents_known());
  EXPECT_EQ(w.document_lengths(), (std::vector<int64_t>{2, 0, 1, 0, 3}));
}

TEST(TokenPacker, WindowsEveryStrideTokens) {
  test::TempDir dir;
  std::vector<uint16_t> t{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto f = TokenFile::open(dir.write("t.bin", bytes_of(t)), TokenFormat::kRaw, DType::kU16);
  PackOptions o;
  o.seq_len = 4;
  o.window_stride = 1;
  TokenPacker p({f}, o);
  ASSERT_EQ(p.num_sequences(), 6);  // every start with 5 tokens after it: 0 to 5
  EXPECT_EQ(row(p, TokenField::kInputIds, 5), (std::vector<int64_t>{5, 6, 7, 8}));
  EXPECT_EQ(row(p, TokenField::kLabels, 5), (std::vector<int64_t>{6, 7, 8, 9}));
  EXPECT_EQ(p.unused_tokens(), 1);  // the last token is a label only
  EXPECT_FALSE(p.documents_known());
  EXPECT_EQ(p.num_documents(), 0);
  o.window_stride = 5;
  EXPECT_THROW(TokenPacker({f}, o), Error);
}

TEST(TokenFile, AMultimodalIndexKeepsItsModes) {
  test::TempDir dir;
  std::vector<uint16_t> t{1, 2, 3, 4, 5, 6};
  const std::string bin = dir.write("m.bin", bytes_of(t));
  const std::string modes("\x00\x01\x01", 3);
  const std::string idx = dir.write("m.idx", megatron_index({2, 1, 3}, {0, 2, 3}) + modes);
  auto f = TokenFile::open(bin, TokenFormat::kMegatron, DType::kU16, idx);
  EXPECT_EQ(f->sequence_modes(), (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(f->sequences().size(), 3u);
  const std::string cut = dir.write("cut.idx", megatron_index({2, 1, 3}, {0, 2, 3}) + "\x01");
  const auto e =
      test::error_from([&] { TokenFile::open(bin, TokenFormat::kMegatron, DType::kU16, cut); });
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("with a multimodal index's mode byte per sequence"),
            std::string::npos);
}

TEST(TokenFile, BadInputsNameFileAndOffset) {
  test::TempDir dir;
  auto e = test::error_from([&] {
    TokenFile::open(dir.write("odd.bin", std::string(7, '\0')), TokenFormat::kRaw, DType::kU16);
  });
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("odd.bin"), std::string::npos);
  EXPECT_NE(e->message().find("byte offset 6"), std::string::npos);

  std::vector<uint16_t> t{1, 2, 3};
  const std::string bin = dir.write("m.bin", bytes_of(t));
  const std::string idx = dir.write("m.idx", megatron_index({2, 5}, {0, 2}));
  e = test::error_from([&] { TokenFile::open(bin, TokenFormat::kMegatron, DType::kU16, idx); });
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("sequence 1"), std::string::npos);

  auto f = TokenFile::open(bin, TokenFormat::kRaw, DType::kU16);
  PackOptions o;
  o.seq_len = 2;
  o.vocab_size = 3;
  TokenPacker p({f}, o);
  e = test::error_from([&] { row(p, TokenField::kLabels, 0); });
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("token id 3 at byte offset 4"), std::string::npos) << e->message();
}

TEST(TokenPacker, RowsInTheFilesOwnDtypeAreItsBytes) {
  test::TempDir dir;
  std::vector<uint16_t> a{0, 1, 2, 3, 60000}, b{5, 6, 7, 8, 9, 10};
  auto fa = TokenFile::open(dir.write("a.bin", bytes_of(a)), TokenFormat::kRaw, DType::kU16);
  auto fb = TokenFile::open(dir.write("b.bin", bytes_of(b)), TokenFormat::kRaw, DType::kU16);
  PackOptions o;
  o.seq_len = 4;
  o.out_dtype = DType::kU16;
  o.vocab_size = 60001;
  TokenPacker p({fa, fb}, o);
  std::vector<uint16_t> out(10);
  const int64_t seqs[] = {1, 0};
  p.write_rows(TokenField::kWindow, seqs, 2, reinterpret_cast<uint8_t*>(out.data()));
  EXPECT_EQ(out, (std::vector<uint16_t>{60000, 5, 6, 7, 8, 0, 1, 2, 3, 60000}));

  o.vocab_size = 60000;
  TokenPacker narrow({fa, fb}, o);
  auto e = test::error_from([&] {
    narrow.write(TokenField::kInputIds, 1, reinterpret_cast<uint8_t*>(out.data()));
  });
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("token id 60000 at byte offset 8"), std::string::npos)
      << e->message();

  std::vector<uint32_t> c{1, 2, 3, 4, 5};
  auto fc = TokenFile::open(dir.write("c.bin", bytes_of(c)), TokenFormat::kRaw, DType::kU32);
  o.vocab_size = 0;
  e = test::error_from([&] { TokenPacker({fa, fc}, o); });
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("c.bin' holds uint32 tokens"), std::string::npos) << e->message();
  o.mode = PackMode::kDocuments;
  o.eod_id = 0;
  e = test::error_from([&] { TokenPacker({fa}, o); });
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("for windows packing"), std::string::npos) << e->message();
}

TEST(TokenPacker, AFileCutWhileMappedIsAnIoErrorNotSigbus) {
  if (!test::kSigbusTests) GTEST_SKIP() << "SIGBUS handling under ThreadSanitizer";
  test::TempDir dir;
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<uint16_t> t(static_cast<size_t>(page) * 2, 7);  // four pages
  const std::string path = dir.write("t.bin", bytes_of(t));
  auto f = TokenFile::open(path, TokenFormat::kRaw, DType::kU16);
  for (DType out_dtype : {DType::kI64, DType::kU16}) {
    PackOptions o;
    o.seq_len = page / 8;  // window i: bytes [i * page / 4, i * page / 4 + page / 4 + 2)
    o.out_dtype = out_dtype;
    TokenPacker p({f}, o);
    ASSERT_EQ(::truncate(path.c_str(), page + 10), 0);
    std::vector<int64_t> out(static_cast<size_t>(o.seq_len) + 1);
    // Window 5 lies past the new end but on its page (zeros, no fault);
    // window 12 on the fourth page, which is gone (SIGBUS).
    for (int64_t seq : {int64_t{5}, int64_t{12}}) {
      auto e = test::error_from(
          [&] { p.write(TokenField::kWindow, seq, reinterpret_cast<uint8_t*>(out.data())); });
      ASSERT_TRUE(e) << seq;
      EXPECT_EQ(e->kind(), ErrorKind::kIo);
      const std::string at = "t.bin': tokens at byte offset " + std::to_string(seq * page / 4);
      EXPECT_NE(e->message().find(at), std::string::npos)
          << e->message();
      EXPECT_NE(e->message().find("cut to " + std::to_string(page + 10) + " bytes"),
                std::string::npos)
          << e->message();
    }
    out.assign(out.size(), -1);
    p.write(TokenField::kWindow, 0, reinterpret_cast<uint8_t*>(out.data()));  // still there
    EXPECT_EQ(out[0], out_dtype == DType::kI64 ? 7 : int64_t{0x0007000700070007});
  }
}

}  // namespace
}  // namespace chute

#include "compose/catalog.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batching/sample_fields.h"
#include "batching/stream_batch_testing.h"
#include "core/error.h"
#include "core/testing.h"
#include "decode/image_field.h"
#include "decode/label_field.h"
#include "decode/npy_field.h"
#include "decode/npy_testing.h"
#include "io/fetch_queue.h"
#include "io/remote_testing.h"
#include "sources/sample_testing.h"
#include "tar/archive_testing.h"

namespace chute {
namespace {

FieldCodecSpec codec(FieldCodec c) {
  FieldCodecSpec spec;
  spec.codec = c;
  return spec;
}

template <typename Decoder>
bool is(const std::shared_ptr<const FieldDecoder>& d) {
  return dynamic_cast<const Decoder*>(d.get()) != nullptr;
}

TEST(Catalog, EachCodecGetsItsDecoder) {
  EXPECT_TRUE(is<NpyFieldDecoder>(field_decoder_for(codec(FieldCodec::kNpy), "x")));
  EXPECT_TRUE(is<LabelFieldDecoder>(field_decoder_for(codec(FieldCodec::kInt), "x")));
  EXPECT_TRUE(is<ImageFieldDecoder>(field_decoder_for(codec(FieldCodec::kImage), "x")));
  FieldCodecSpec gray = codec(FieldCodec::kImage);
  gray.color = ColorMode::kGray;
  gray.image.out_height = 8;
  gray.image.out_width = 8;
  EXPECT_TRUE(is<ImageFieldDecoder>(field_decoder_for(gray, "x")));
}

TEST(Catalog, RawBytesGetNoDecoder) {
  // The engine hands such a field's bytes to Python undecoded.
  EXPECT_EQ(field_decoder_for(codec(FieldCodec::kRaw), "meta"), nullptr);
}

TEST(Catalog, AnUnknownCodecIsAUsageErrorNamingTheField) {
  const std::optional<Error> e =
      test::error_from([] { field_decoder_for(codec(static_cast<FieldCodec>(42)), "weird"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(), "field 'weird': no decoder for codec 42");
}

TEST(Catalog, AnImageSpecThatCannotWorkIsAUsageErrorNamingTheField) {
  FieldCodecSpec spec = codec(FieldCodec::kImage);
  spec.image.out_height = 224;  // no width
  const std::optional<Error> e = test::error_from([&] { field_decoder_for(spec, "pixels"); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_NE(e->message().find("'pixels'"), std::string::npos) << e->message();
}

std::string read_all(const RangeReader& reader, uint64_t offset, size_t size) {
  std::string out(size, '\0');
  reader.read(offset, size, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

TEST(Catalog, IndexedTarShardsAreReadFromFilesOrByRemoteRanges) {
  test::TempDir dir;
  const TarIndex::Shard file{"shard.tar", dir.write("shard.tar", "0123456789"),
                             ShardIdentity{10, -1, ""}};
  const TarIndex::Shard object{"s3://b/k.tar", "s3://b/k.tar", ShardIdentity{10, -1, "\"t\""}};
  EXPECT_EQ(read_all(*shard_reader_for(file, nullptr), 2, 3), "234");

  FetchSettings settings;
  settings.backoff_s = 0.001;
  settings.max_backoff_s = 0.002;
  auto queue = std::make_shared<FetchQueue>(settings);
  test::MemoryStore store(queue, "abcdefghij", "\"t\"");
  EXPECT_EQ(read_all(*shard_reader_for(object, queue), 2, 3), "cde");
  const size_t asked = store.seen().size();
  EXPECT_GE(asked, 2u);  // its HEAD and a range
  // A local file is read from disk even where remote objects are read too.
  EXPECT_EQ(read_all(*shard_reader_for(file, queue), 7, 3), "789");
  EXPECT_EQ(store.seen().size(), asked);
  // An object that is not the one indexed (another size) is refused.
  const TarIndex::Shard resized{"s3://b/k.tar", "s3://b/k.tar", ShardIdentity{11, -1, ""}};
  const std::optional<Error> e = test::error_from([&] { shard_reader_for(resized, queue); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  // Without a queue a url is no file that can be opened.
  const std::optional<Error> missing = test::error_from([&] { shard_reader_for(object, nullptr); });
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->kind(), ErrorKind::kIo);
}

TEST(Catalog, ARemoteShardsHeaderDigestReadsItsHeadersOnly) {
  // Payloads far larger than the gap over which ranged reads merge.
  const std::string tar = test::file("a.bin", std::string(200000, 'x')) +
                          test::file("a.cls", "1") +
                          test::file("b.bin", std::string(200000, 'y')) + test::end_blocks();
  test::TempDir dir;
  const auto size = static_cast<int64_t>(tar.size());
  const TarIndex::Shard file{"s.tar", dir.write("s.tar", tar), ShardIdentity{size, -1, ""}};
  const std::vector<ScannedSample> samples = scan_tar_index(open_source(file.path, {}));
  ASSERT_EQ(samples.size(), 2u);
  const uint64_t local = header_digest(samples, *shard_reader_for(file, nullptr));

  FetchSettings settings;
  settings.backoff_s = 0.001;
  settings.max_backoff_s = 0.002;
  auto queue = std::make_shared<FetchQueue>(settings);
  test::MemoryStore store(queue, tar, "\"t\"");
  const TarIndex::Shard object{"s3://b/s.tar", "s3://b/s.tar", ShardIdentity{size, -1, "\"t\""}};
  EXPECT_EQ(header_digest(samples, *shard_reader_for(object, queue)), local);
  uint64_t fetched = 0;
  for (const test::MemoryStore::Seen& seen : store.seen()) {
    if (seen.op == FetchOp::kRange) fetched += seen.length;
  }
  EXPECT_GT(fetched, 0u);
  EXPECT_LT(fetched, tar.size() / 4);
}

// The catalog's npy and label decoders, run the way the stream engine runs
// them: probed per sample, decoded into stacked columns of one batch.
FieldPlan catalog_field(const std::string& name, const std::string& extension, FieldCodec c) {
  FieldPlan f;
  f.name = name;
  f.extensions = {extension};
  f.decoder = field_decoder_for(codec(c), name);
  return f;
}

TEST(Catalog, NpyAndLabelFieldsDecodeIntoStackedColumns) {
  test::BatchRun r;
  r.plan.fields = {catalog_field("x", "npy", FieldCodec::kNpy),
                   catalog_field("y", "cls", FieldCodec::kInt)};
  std::vector<EncodedSample> samples;
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> values = {float(i), 0.5f, -1.0f * float(i), 2.0f + float(i)};
    const std::string dict = i == 1 ? "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }"
                                    : "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
    const std::string payload = test::npy_file(
        dict, i == 1 ? test::swapped_bytes(values) : test::raw_bytes(values));
    samples.push_back(test::encoded_sample(
        "s" + std::to_string(i), {{"cls", " " + std::to_string(10 - i) + "\n"}, {"npy", payload}}));
  }
  const std::optional<Batch> b = r.run(std::move(samples));
  ASSERT_TRUE(b) << r.error->what();
  ASSERT_EQ(b->size, 3);
  const Tensor& x = b->columns[0].stacked;
  EXPECT_EQ(b->columns[0].kind, ColumnKind::kStacked);
  EXPECT_EQ(x.dtype, DType::kF32);
  EXPECT_EQ(x.shape, (std::vector<int64_t>{3, 2, 2}));
  std::vector<float> xs(12);
  std::memcpy(xs.data(), x.data(), x.nbytes());
  EXPECT_EQ(xs, (std::vector<float>{0, 0.5f, 0, 2, 1, 0.5f, -1, 3, 2, 0.5f, -2, 4}));
  const Tensor& y = b->columns[1].stacked;
  EXPECT_EQ(y.dtype, DType::kI64);
  EXPECT_EQ(y.shape, (std::vector<int64_t>{3}));
  std::vector<int64_t> ys(3);
  std::memcpy(ys.data(), y.data(), y.nbytes());
  EXPECT_EQ(ys, (std::vector<int64_t>{10, 9, 8}));
}

TEST(Catalog, ABadLabelIsReportedWhereItLies) {
  StreamPlan plan;
  plan.urls = {"shard.tar"};
  plan.sources = std::make_shared<test::LocatingSources>();
  plan.fields = {catalog_field("y", "cls", FieldCodec::kInt)};
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);
  PlannedSample s;
  s.encoded = test::encoded_sample("k", {{"cls", "x"}});
  const std::optional<Error> e = test::error_from([&] { fields.probe(s); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(),
            "shard.tar sample 'k' member 'k.cls': invalid integer label b'x' (expected decimal "
            "digits, as Python's int() reads them)");
  EXPECT_STREQ(e->file(), "label.cc");  // raised by the label parser, kept through the engine
}

}  // namespace
}  // namespace chute

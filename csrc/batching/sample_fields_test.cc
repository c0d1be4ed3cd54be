#include "batching/sample_fields.h"
#include "engine/stream_plan.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "sources/sample_testing.h"

namespace chute {
namespace {

using test::encoded_sample;

FieldPlan field(const std::string& name, std::vector<std::string> extensions,
                std::shared_ptr<const FieldDecoder> decoder, bool optional = false,
                bool stack = true) {
  FieldPlan f;
  f.name = name;
  f.extensions = std::move(extensions);
  f.decoder = std::move(decoder);
  f.optional = optional;
  f.stack = stack;
  return f;
}

StreamPlan plan_with(std::vector<FieldPlan> fields) {
  StreamPlan plan;
  plan.urls = {"shard-a.tar", "shard-b.tar"};
  plan.sources = std::make_shared<test::LocatingSources>();
  plan.fields = std::move(fields);
  return plan;
}

PlannedSample planned(EncodedSample encoded) {
  PlannedSample s;
  s.encoded = std::move(encoded);
  return s;
}

// The kData error that probing `sample` raises.
std::optional<Error> probe_error(const SampleFields& fields, PlannedSample& sample) {
  return test::error_from([&] { fields.probe(sample); });
}

TEST(SampleFields, TheFirstListedExtensionPresentWins) {
  const auto digits = std::make_shared<test::DigitsDecoder>();
  const StreamPlan plan = plan_with({field("image", {"jpg", "png"}, digits)});
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);

  // Both present: jpg is listed first, whatever the member order.
  PlannedSample both = planned(encoded_sample("a", {{"png", "12"}, {"txt", "x"}, {"jpg", "345"}}));
  fields.probe(both);
  ASSERT_EQ(both.fields.size(), 1u);
  EXPECT_EQ(both.fields[0].member, 2);
  EXPECT_EQ(both.fields[0].shape, (std::vector<int64_t>{3}));  // probed from the jpg

  // Only the second alternative present.
  PlannedSample png = planned(encoded_sample("b", {{"txt", "x"}, {"png", "12"}}));
  fields.probe(png);
  EXPECT_EQ(png.fields[0].member, 1);
  EXPECT_EQ(png.fields[0].dtype, DType::kU8);
  EXPECT_EQ(png.fields[0].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(png.fields[0].detail[0], 2);
}

TEST(SampleFields, ExtensionsMatchWhole) {
  const StreamPlan plan = plan_with({field("mask", {"npy"}, nullptr, true)});
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);
  // "seg.npy" is a member of its own, not a "npy" member.
  PlannedSample s = planned(encoded_sample("a", {{"seg.npy", "1"}, {"npy", "2"}}));
  fields.probe(s);
  EXPECT_EQ(s.fields[0].member, 1);
  PlannedSample only = planned(encoded_sample("b", {{"seg.npy", "1"}}));
  fields.probe(only);
  EXPECT_EQ(only.fields[0].member, -1);
}

TEST(SampleFields, AMissingRequiredFieldNamesItTheWantedExtensionsAndTheSamplesMembers) {
  const auto digits = std::make_shared<test::DigitsDecoder>();
  const StreamPlan plan =
      plan_with({field("label", {"cls"}, digits), field("image", {"jpg", "jpeg", "png"}, digits)});
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);
  PlannedSample s = planned(encoded_sample("dir/x7", {{"cls", "3"}, {"txt", "hi"}, {"json", "{}"}}, 1));
  const std::optional<Error> e = probe_error(fields, s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(),
            "shard-b.tar sample 'dir/x7': field 'image' not found "
            "(wanted one of jpg;jpeg;png; sample has cls, txt, json)");
  EXPECT_EQ(e->scope(), ErrorScope::kField);
  EXPECT_EQ(e->place().url, "shard-b.tar");
  EXPECT_EQ(e->place().key, "dir/x7");
  EXPECT_EQ(e->place().member, "");
}

TEST(SampleFields, ARequiredFieldWhoseValueIsNullSaysSoNamingItsColumn) {
  const auto digits = std::make_shared<test::DigitsDecoder>();
  const StreamPlan plan = plan_with({field("image", {"c0"}, digits)});
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);
  EncodedSample enc = encoded_sample("4", {{"c1", "7"}}, 1);
  SampleMember null;
  null.extension = "c0";
  null.name = "image";
  enc.nulls.push_back(null);
  PlannedSample s = planned(std::move(enc));
  const std::optional<Error> e = probe_error(fields, s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(), "shard-b.tar sample '4': column 'image' is null");
  EXPECT_EQ(e->scope(), ErrorScope::kField);
}

TEST(SampleFields, AnAbsentOptionalFieldIsMarkedAbsent) {
  const auto digits = std::make_shared<test::DigitsDecoder>();
  const StreamPlan plan = plan_with(
      {field("label", {"cls"}, digits), field("depth", {"depth.png"}, digits, /*optional=*/true)});
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);
  // Probed first with the field present, then reused for a sample without
  // it: nothing of the first sample's probe may be left over.
  PlannedSample s = planned(encoded_sample("a", {{"cls", "1"}, {"depth.png", "9999"}}));
  fields.probe(s);
  EXPECT_EQ(s.fields[1].member, 1);
  EXPECT_EQ(s.fields[1].shape, (std::vector<int64_t>{4}));
  s.encoded = encoded_sample("b", {{"cls", "2"}});
  s.fields[1].dtype = DType::kF64;
  fields.probe(s);
  ASSERT_EQ(s.fields.size(), 2u);
  EXPECT_EQ(s.fields[0].member, 0);
  EXPECT_EQ(s.fields[1].member, -1);
  EXPECT_EQ(s.fields[1].dtype, DType::kU8);
  EXPECT_TRUE(s.fields[1].shape.empty());
}

TEST(SampleFields, ARawFieldIsFoundButNotProbed) {
  // No decoder: the bytes go to Python, even ones a decoder would refuse.
  const StreamPlan plan = plan_with({field("meta", {"json"}, nullptr)});
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);
  PlannedSample s = planned(encoded_sample("a", {{"txt", "x"}, {"json", "!{}"}}));
  fields.probe(s);
  EXPECT_EQ(s.fields[0].member, 1);
  EXPECT_TRUE(s.fields[0].shape.empty());
}

TEST(SampleFields, ABadHeaderFailsNamingTheMemberAndKeepsWhereItWasRaised) {
  const auto digits = std::make_shared<test::DigitsDecoder>();
  const StreamPlan plan = plan_with({field("image", {"jpg"}, digits)});
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);
  PlannedSample s = planned(encoded_sample("k9", {{"jpg", "!12"}}));
  const std::optional<Error> e = probe_error(fields, s);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(), "shard-a.tar sample 'k9' member 'k9.jpg': bad digits header '!'");
  EXPECT_STREQ(e->file(), "sample_testing.h");  // the decoder's line, not the engine's
  EXPECT_EQ(e->scope(), ErrorScope::kMember);
  EXPECT_EQ(e->place().url, "shard-a.tar");
  EXPECT_EQ(e->place().member, "k9.jpg");
  EXPECT_EQ(e->place().key, "k9");
}

TEST(SampleFields, InContextKeepsKindAndPlaceAndPutsThePlaceInFront) {
  const StreamPlan plan = plan_with({});
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);
  const EncodedSample s = encoded_sample("k", {{"cls", "1"}}, 1);
  const Error plain(ErrorKind::kIo, "read failed", "somewhere.cc", 12);
  const Error a = fields.in_context(plain, s, &s.members[0]);
  EXPECT_EQ(a.kind(), ErrorKind::kIo);
  EXPECT_EQ(a.message(), "shard-b.tar sample 'k' member 'k.cls': read failed");
  EXPECT_STREQ(a.file(), "somewhere.cc");
  EXPECT_EQ(a.line(), 12);
  // Decoders called without a place of their own start with their own words.
  const Error placeless(ErrorKind::kData, "truncated", "npy.cc", 3);
  EXPECT_EQ(fields.in_context(placeless, s, nullptr).message(), "shard-b.tar sample 'k': truncated");
}

TEST(SampleFields, WithContextRethrowsOnlyChuteErrors) {
  const StreamPlan plan = plan_with({});
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);
  const EncodedSample s = encoded_sample("k", {{"cls", "1"}});
  bool ran = false;
  fields.with_context(s, nullptr, [&] { ran = true; });
  EXPECT_TRUE(ran);
  const std::optional<Error> e = test::error_from([&] {
    fields.with_context(s, &s.members[0], [] { CHUTE_CHECK(false, kUsage, "no"); });
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kUsage);
  EXPECT_EQ(e->message(), "shard-a.tar sample 'k' member 'k.cls': no");
  // Anything else is not the data's fault: it passes through untouched.
  try {
    fields.with_context(s, nullptr, [] { throw std::runtime_error("plain"); });
    ADD_FAILURE() << "nothing thrown";
  } catch (const Error& wrapped) {
    ADD_FAILURE() << "wrapped as a chute::Error: " << wrapped.what();
  } catch (const std::runtime_error& plain) {
    EXPECT_STREQ(plain.what(), "plain");
  }
}

TEST(SampleFields, AnErrorAboutBytesThatWereLostReportsTheLoss) {
  const StreamPlan plan = plan_with({});
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);
  std::shared_ptr<test::TestStorage> storage;
  const std::vector<EncodedSample> samples =
      test::in_place_samples({{"a", {{"cls", "1"}}}, {"b", {{"cls", "2"}}}}, &storage);
  storage->lose("b");
  const Error garbage(ErrorKind::kData, "not a digit", "label.cc", 5);
  // a's bytes are intact: its own error stands.
  EXPECT_EQ(fields.in_context(garbage, samples[0], nullptr).message(),
            "shard-a.tar sample 'a': not a digit");
  // b's bytes were cut away: what was decoded was not its data.
  const Error lost = fields.in_context(garbage, samples[1], &samples[1].members[0]);
  EXPECT_EQ(lost.kind(), ErrorKind::kIo);
  EXPECT_EQ(lost.message(), "sample 'b' was cut from the shard");
  // A read failure, not a member that does not decode.
  EXPECT_EQ(lost.scope(), ErrorScope::kRead);
}

TEST(SampleFields, SamplesFitABatchWhenEveryStackedFieldAgrees) {
  const auto digits = std::make_shared<test::DigitsDecoder>();
  const StreamPlan plan =
      plan_with({field("tokens", {"tok"}, digits, false, /*stack=*/false),  // a list: any length
                 field("meta", {"json"}, nullptr),
                 field("depth", {"depth"}, digits, /*optional=*/true),
                 field("image", {"img"}, digits)});
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);
  PlannedSample first = planned(encoded_sample("a", {{"tok", "1"}, {"json", "{}"}, {"img", "12"}}));
  PlannedSample same = planned(
      encoded_sample("b", {{"tok", "1234"}, {"json", "[1]"}, {"depth", "5"}, {"img", "34"}}));
  PlannedSample wider = planned(encoded_sample("c", {{"tok", "1"}, {"json", "{}"}, {"img", "567"}}));
  fields.probe(first);
  fields.probe(same);
  fields.probe(wider);
  EXPECT_FALSE(fields.incompatibility(first, same));
  const std::optional<Error> e = fields.incompatibility(first, wider);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::kData);
  EXPECT_EQ(e->message(),
            "shard-a.tar sample 'c' member 'c.img': field 'image' has uint8 shape (3,) but this "
            "batch holds uint8 shape (2,) (set an output size to resize images, or batch variable "
            "shapes as lists)");
}

TEST(SampleFields, ADifferentDtypeDoesNotFitABatch) {
  const auto digits = std::make_shared<test::DigitsDecoder>();
  const StreamPlan plan = plan_with({field("x", {"bin"}, digits)});
  const SampleDecoding decoding = sample_decoding_of(plan);
  const SampleFields fields(decoding);
  PlannedSample a = planned(encoded_sample("a", {{"bin", "12"}}));
  PlannedSample b = planned(encoded_sample("b", {{"bin", "34"}}));
  fields.probe(a);
  fields.probe(b);
  b.fields[0].dtype = DType::kI8;  // the same shape
  const std::optional<Error> same_shape = fields.incompatibility(a, b);
  ASSERT_TRUE(same_shape);
  EXPECT_EQ(same_shape->message().substr(0, same_shape->message().find(" (set")),
            "shard-a.tar sample 'b' member 'b.bin': field 'x' has int8 shape (2,) but this "
            "batch holds uint8 shape (2,)");
  EXPECT_EQ(same_shape->scope(), ErrorScope::kBatch);
  EXPECT_EQ(same_shape->place().member, "b.bin");
  EXPECT_EQ(same_shape->place().key, "b");
  b.fields[0].dtype = DType::kF32;
  b.fields[0].shape = {2, 3};
  const std::optional<Error> e = fields.incompatibility(a, b);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message().substr(0, e->message().find(" (set")),
            "shard-a.tar sample 'b' member 'b.bin': field 'x' has float32 shape (2, 3) but this "
            "batch holds uint8 shape (2,)");
}

}  // namespace
}  // namespace chute

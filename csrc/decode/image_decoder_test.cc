#include "decode/image_decoder.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "decode/image_testing.h"
#include "image/output_spec.h"
#include "image/pixel_format.h"

namespace chute {
namespace {

const std::vector<uint8_t>& jpeg() {
  static const std::vector<uint8_t> bytes = test::encode_jpeg(test::photo(20, 30, 1), 20, 30);
  return bytes;
}
const std::vector<uint8_t>& png() {
  static const std::vector<uint8_t> bytes = test::encode_png(test::photo(21, 31, 2), 21, 31);
  return bytes;
}

const char* sniffed(const std::vector<uint8_t>& bytes) {
  return detail::sniff_image(bytes.data(), bytes.size(), "m").name;
}

std::string data_error(const std::vector<uint8_t>& bytes) {
  const auto err =
      test::error_from([&] { detail::sniff_image(bytes.data(), bytes.size(), "member 'k.x'"); });
  if (!err) return "no error";
  EXPECT_EQ(err->kind(), ErrorKind::kData);
  return err->message();
}

TEST(ImageCodecs, SniffingPicksTheRowOfTheSignature) {
  EXPECT_STREQ(sniffed(jpeg()), "jpeg");
  EXPECT_STREQ(sniffed(png()), "png");
  // The signature alone decides; the header behind it is the row's to check.
  const std::vector<uint8_t> png_signature{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  EXPECT_STREQ(sniffed(png_signature), "png");
  const auto err =
      test::error_from([&] { probe_image(png_signature.data(), png_signature.size(), "m"); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->kind(), ErrorKind::kData);
  EXPECT_EQ(err->message(), "m: corrupt PNG header: truncated (8 bytes)");
}

TEST(ImageCodecs, ProbeNamesTheFormatAndSize) {
  const ImageInfo j = probe_image(jpeg().data(), jpeg().size(), "m");
  EXPECT_STREQ(j.format, "jpeg");
  EXPECT_EQ(j.width, 30);
  EXPECT_EQ(j.height, 20);
  const ImageInfo p = probe_image(png().data(), png().size(), "m");
  EXPECT_STREQ(p.format, "png");
  EXPECT_EQ(p.width, 31);
  EXPECT_EQ(p.height, 21);
}

TEST(ImageCodecs, UnknownFormatsNameEveryRowAndTheLeadingBytes) {
  const std::vector<uint8_t> gif{'G', 'I', 'F', '8', '9', 'a', 1, 2, 3};
  EXPECT_EQ(data_error(gif),
            "member 'k.x': not a JPEG or PNG image (9 bytes starting with "
            "47 49 46 38 39 61 01 02)");
  // Signatures cut short match no row.
  EXPECT_NE(data_error({0xFF, 0xD8}).find("not a JPEG or PNG image (2 bytes"),
            std::string::npos);
  EXPECT_EQ(data_error({}), "member 'k.x': empty image data");
}

// decode_image_resampled of a centred window of the image, at `how`.
std::vector<uint8_t> resampled(const std::vector<uint8_t>& bytes, ColorMode mode, RegionDecode how,
                               RegionDecodeInfo* info) {
  const ImageInfo image = probe_image(bytes.data(), bytes.size(), "m");
  SourceArea area;
  area.region = Window{5, 7, image.height - 9, image.width - 12};
  area.box = Box{5.5, 7.25, image.height - 4.0, image.width - 5.5};
  const int c = mode == ColorMode::kRgb ? 3 : 1;
  ImageOutputSpec spec;
  spec.layout = Layout::kHWC;
  const OutputFormat format = output_format(spec);
  std::vector<uint8_t> result(static_cast<size_t>(9) * 11 * c);
  ResampleOutput out;
  out.height = 9;
  out.width = 11;
  out.format = &format;
  out.data = result.data();
  *info = decode_image_resampled(bytes.data(), bytes.size(), mode, area, out, how, "m");
  return result;
}

TEST(ImageCodecs, AFormatWithoutRegionDecodeDecodesWhole) {
  RegionDecodeInfo full;
  RegionDecodeInfo crop;
  const std::vector<uint8_t> expected =
      resampled(png(), ColorMode::kRgb, RegionDecode::kFull, &full);
  EXPECT_EQ(resampled(png(), ColorMode::kRgb, RegionDecode::kCrop, &crop), expected);
  EXPECT_EQ(crop.decoded.y, 0);
  EXPECT_EQ(crop.decoded.x, 0);
  EXPECT_EQ(crop.decoded.height, 21);
  EXPECT_EQ(crop.decoded.width, 31);
}

}  // namespace
}  // namespace chute

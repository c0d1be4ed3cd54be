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
const std::vector<uint8_t>& webp() {
  static const std::vector<uint8_t> bytes = test::encode_webp(test::photo(22, 32, 3), 22, 32);
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
  EXPECT_STREQ(sniffed(webp()), "webp");
  // The signature alone decides; the header behind it is the row's to check.
  const std::vector<uint8_t> riff{'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'E', 'B', 'P'};
  EXPECT_STREQ(sniffed(riff), "webp");
  const auto err = test::error_from([&] { probe_image(riff.data(), riff.size(), "m"); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->kind(), ErrorKind::kData);
  EXPECT_EQ(err->message().rfind("m: corrupt WebP header: ", 0), 0u) << err->message();
}

TEST(ImageCodecs, FormatsListEachRowWithItsExtensions) {
  const std::vector<ImageFormat> formats = image_formats();
  ASSERT_EQ(formats.size(), 3u);
  EXPECT_EQ(formats[0].name, "jpeg");
  EXPECT_EQ(formats[0].title, "JPEG");
  EXPECT_EQ(formats[0].extensions, (std::vector<std::string>{"jpg", "jpeg"}));
  EXPECT_TRUE(formats[0].region_decode);
  EXPECT_EQ(formats[1].name, "png");
  EXPECT_EQ(formats[1].extensions, std::vector<std::string>{"png"});
  EXPECT_FALSE(formats[1].region_decode);
  EXPECT_EQ(formats[2].name, "webp");
  EXPECT_EQ(formats[2].extensions, std::vector<std::string>{"webp"});
  EXPECT_TRUE(formats[2].region_decode);
  // Each name is what probing an image of the format answers.
  EXPECT_STREQ(sniffed(jpeg()), formats[0].name.c_str());
  EXPECT_STREQ(sniffed(png()), formats[1].name.c_str());
  EXPECT_STREQ(sniffed(webp()), formats[2].name.c_str());
}

TEST(ImageCodecs, ProbeNamesTheFormatAndSize) {
  const ImageInfo j = probe_image(jpeg().data(), jpeg().size(), "m");
  EXPECT_STREQ(j.format, "jpeg");
  EXPECT_EQ(j.width, 30);
  EXPECT_EQ(j.height, 20);
  const ImageInfo p = probe_image(png().data(), png().size(), "m");
  EXPECT_STREQ(p.format, "png");
  EXPECT_EQ(p.width, 31);
  const ImageInfo w = probe_image(webp().data(), webp().size(), "m");
  EXPECT_STREQ(w.format, "webp");
  EXPECT_EQ(w.width, 32);
  EXPECT_EQ(w.height, 22);
}

TEST(ImageCodecs, UnknownFormatsNameEveryRowAndTheLeadingBytes) {
  const std::vector<uint8_t> gif{'G', 'I', 'F', '8', '9', 'a', 1, 2, 3};
  EXPECT_EQ(data_error(gif),
            "member 'k.x': not a JPEG, PNG or WebP image (9 bytes starting with "
            "47 49 46 38 39 61 01 02)");
  // A RIFF file of another form (WAVE audio) is not WebP.
  const std::vector<uint8_t> wave{'R', 'I', 'F', 'F', 4, 0, 0, 0, 'W', 'A', 'V', 'E'};
  EXPECT_EQ(data_error(wave),
            "member 'k.x': not a JPEG, PNG or WebP image (12 bytes starting with "
            "52 49 46 46 04 00 00 00)");
  // Signatures cut short match no row.
  EXPECT_NE(data_error({0xFF, 0xD8}).find("not a JPEG, PNG or WebP image (2 bytes"),
            std::string::npos);
  EXPECT_NE(data_error({'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'E', 'B'}).find("(11 bytes"),
            std::string::npos);
  EXPECT_EQ(data_error({}), "member 'k.x': empty image data");
}

TEST(ImageCodecs, WebpDecodesLosslessPixelsExactlyAndGrayAsLuma) {
  const std::vector<uint8_t> rgb = test::photo(22, 32, 3);
  std::vector<uint8_t> got(rgb.size());
  decode_image(webp().data(), webp().size(), ColorMode::kRgb, got.data(), "m");
  EXPECT_EQ(got, rgb);
  std::vector<uint8_t> luma(22 * 32);
  detail::rgb_to_l(rgb.data(), luma.data(), luma.size());
  std::vector<uint8_t> gray(luma.size());
  decode_image(webp().data(), webp().size(), ColorMode::kGray, gray.data(), "m");
  EXPECT_EQ(gray, luma);
}

TEST(ImageCodecs, WebpErrorsNameWhere) {
  std::vector<uint8_t> cut(webp().begin(), webp().begin() + webp().size() / 2);
  std::vector<uint8_t> out(22 * 32 * 3);
  auto err = test::error_from(
      [&] { decode_image(cut.data(), cut.size(), ColorMode::kRgb, out.data(), "m"); });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->kind(), ErrorKind::kData);
  EXPECT_EQ(err->message(), "m: corrupt WebP: truncated (not enough data)");
  set_max_image_pixels(22 * 32 - 1);
  err = test::error_from([&] { probe_image(webp().data(), webp().size(), "m"); });
  set_max_image_pixels(kDefaultMaxImagePixels);
  ASSERT_TRUE(err);
  EXPECT_NE(err->message().find("m: WebP image is 32x22 = 704 pixels, above the limit"),
            std::string::npos);
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

TEST(ImageCodecs, RegionDecodeOfAWebpIsItsCropWithTheFullDecodesPixels) {
  const std::vector<uint8_t> lossy = test::encode_webp(test::photo(60, 70, 4), 60, 70, 70);
  for (const std::vector<uint8_t>* bytes : {&webp(), &lossy}) {
    for (ColorMode mode : {ColorMode::kRgb, ColorMode::kGray}) {
      RegionDecodeInfo full;
      RegionDecodeInfo crop;
      const std::vector<uint8_t> expected = resampled(*bytes, mode, RegionDecode::kFull, &full);
      EXPECT_EQ(resampled(*bytes, mode, RegionDecode::kCropScaled, &crop), expected);
      const ImageInfo image = probe_image(bytes->data(), bytes->size(), "m");
      EXPECT_EQ(full.decoded.height, image.height);
      EXPECT_EQ(full.decoded.width, image.width);
      // Only part of the image, from even coordinates; no scaling.
      EXPECT_EQ(crop.scale_num, 8);
      EXPECT_LT(static_cast<int64_t>(crop.decoded.height) * crop.decoded.width,
                static_cast<int64_t>(image.height) * image.width);
      EXPECT_EQ(crop.decoded.x % 2, 0);
      EXPECT_EQ(crop.decoded.y % 2, 0);
    }
  }
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

#include "decode/image_field.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/testing.h"
#include "decode/image_testing.h"
#include "image/crop_params.h"
#include "image/pixel_format.h"
#include "image/resample.h"

namespace chute {
namespace {

struct Encoded {
  std::vector<uint8_t> bytes;
  int height;
  int width;
};

Encoded jpeg(int h, int w, int seed) {
  return {test::encode_jpeg(test::photo(h, w, seed), h, w), h, w};
}
Encoded png(int h, int w, int seed) {
  return {test::encode_png(test::photo(h, w, seed), h, w), h, w};
}
Encoded webp(int h, int w, int seed, float quality) {
  return {test::encode_webp(test::photo(h, w, seed), h, w, quality), h, w};
}

ProbedField probe(const ImageFieldDecoder& d, const Encoded& e) {
  ProbedField p;
  d.probe(e.bytes.data(), e.bytes.size(), p);
  return p;
}

// The decoder's row, as bytes.
std::vector<uint8_t> decode_row(const ImageFieldDecoder& d, const Encoded& e,
                                const RowPosition& at) {
  const ProbedField p = probe(d, e);
  size_t elements = 1;
  for (int64_t s : p.shape) elements *= static_cast<size_t>(s);
  std::vector<uint8_t> out(elements * dtype_size(p.dtype));
  d.decode(e.bytes.data(), e.bytes.size(), p, at, out.data());
  return out;
}

std::vector<uint8_t> full_decode(const Encoded& e, ColorMode mode) {
  std::vector<uint8_t> out(static_cast<size_t>(e.height) * e.width *
                           (mode == ColorMode::kRgb ? 3 : 1));
  decode_image(e.bytes.data(), e.bytes.size(), mode, out.data(), "test");
  return out;
}

// What the decoder should write for the row at `at`: its placement
// resampled from the whole decoded image by the resampler itself.
std::vector<uint8_t> expected_row(const ImageFieldDecoder& d, const ImageOutputSpec& spec,
                                  const Encoded& e, ColorMode mode, const RowPosition& at) {
  const ImagePlacement p = d.placement(e.height, e.width, at);
  const OutputFormat format = output_format(spec);
  const int c = mode == ColorMode::kRgb ? 3 : 1;
  ResampleOutput out;
  out.height = spec.resizes() ? spec.out_height : e.height;
  out.width = spec.resizes() ? spec.out_width : e.width;
  out.flip = p.flip;
  out.format = &format;
  std::vector<uint8_t> result(static_cast<size_t>(out.height) * out.width * c *
                              format.element_size());
  out.data = result.data();
  const std::vector<uint8_t> pixels = full_decode(e, mode);
  resample_area_into(pixels.data(), e.height, e.width, c, p.area, out);
  return result;
}

RowPosition at(int64_t batch, size_t row, uint64_t seed = 7) { return {seed, 3, batch, row, 1}; }

TEST(ImageField, ProbeGivesShapeAndTypePerSpec) {
  const Encoded e = jpeg(30, 41, 1);
  ImageOutputSpec spec;
  ProbedField p = probe(ImageFieldDecoder(ColorMode::kRgb, spec, "f"), e);
  EXPECT_EQ(p.shape, (std::vector<int64_t>{30, 41, 3}));
  EXPECT_EQ(p.dtype, DType::kU8);
  EXPECT_EQ(p.detail[0], 30);
  EXPECT_EQ(p.detail[1], 41);
  spec.layout = Layout::kCHW;
  spec.dtype = PixelType::kFloat16;
  spec.out_height = 8;
  spec.out_width = 12;
  p = probe(ImageFieldDecoder(ColorMode::kRgb, spec, "f"), e);
  EXPECT_EQ(p.shape, (std::vector<int64_t>{3, 8, 12}));
  EXPECT_EQ(p.dtype, DType::kF16);
  spec.dtype = PixelType::kBFloat16;  // the bits, as uint16
  EXPECT_EQ(probe(ImageFieldDecoder(ColorMode::kRgb, spec, "f"), e).dtype, DType::kU16);
  spec.dtype = PixelType::kFloat32;
  p = probe(ImageFieldDecoder(ColorMode::kGray, spec, "f"), e);
  EXPECT_EQ(p.shape, (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(p.dtype, DType::kF32);
  spec.squeeze_gray = false;
  EXPECT_EQ(probe(ImageFieldDecoder(ColorMode::kGray, spec, "f"), e).shape,
            (std::vector<int64_t>{8, 12, 1}));
}

TEST(ImageField, NoResizeIsTheFullDecode) {
  for (const Encoded& e : {jpeg(37, 50, 2), png(23, 19, 3), webp(29, 31, 7, 80)}) {
    const ImageFieldDecoder plain(ColorMode::kRgb, ImageOutputSpec{}, "f");
    EXPECT_EQ(decode_row(plain, e, at(0, 0)), full_decode(e, ColorMode::kRgb));
    // CHW float16, normalised: each value from the decoded byte, per channel.
    ImageOutputSpec spec;
    spec.layout = Layout::kCHW;
    spec.dtype = PixelType::kFloat16;
    spec.normalize = true;
    spec.mean = {0.5f, 0.4f, 0.3f};
    spec.std = {0.2f, 0.25f, 0.3f};
    const ImageFieldDecoder d(ColorMode::kRgb, spec, "f");
    const std::vector<uint8_t> row = decode_row(d, e, at(0, 0));
    const std::vector<uint8_t> hwc = full_decode(e, ColorMode::kRgb);
    const size_t plane = static_cast<size_t>(e.height) * e.width;
    ASSERT_EQ(row.size(), plane * 3 * 2);
    for (size_t i = 0; i < plane; ++i) {
      for (int c = 0; c < 3; ++c) {
        const float x = (static_cast<float>(hwc[i * 3 + c]) / 255.0f - spec.mean[c]) / spec.std[c];
        uint16_t got;
        std::memcpy(&got, &row[(c * plane + i) * 2], 2);
        ASSERT_EQ(got, float_to_half_bits(x)) << i << " " << c;
      }
    }
  }
}

TEST(ImageField, FlipFollowsThePlacementOfEachRow) {
  const Encoded e = jpeg(20, 33, 4);
  ImageOutputSpec spec;
  spec.random_flip = true;
  const ImageFieldDecoder d(ColorMode::kRgb, spec, "f");
  const std::vector<uint8_t> plain = full_decode(e, ColorMode::kRgb);
  int flipped = 0;
  for (size_t row = 0; row < 32; ++row) {
    const std::vector<uint8_t> got = decode_row(d, e, at(5, row));
    EXPECT_EQ(got, decode_row(d, e, at(5, row)));  // the same position draws the same
    const bool flip = d.placement(e.height, e.width, at(5, row)).flip;
    flipped += flip;
    for (int y = 0; y < e.height; ++y) {
      for (int x = 0; x < e.width; ++x) {
        const int sx = flip ? e.width - 1 - x : x;
        for (int c = 0; c < 3; ++c) {
          ASSERT_EQ(got[(static_cast<size_t>(y) * e.width + x) * 3 + c],
                    plain[(static_cast<size_t>(y) * e.width + sx) * 3 + c]);
        }
      }
    }
  }
  EXPECT_GT(flipped, 4);
  EXPECT_LT(flipped, 28);
}

TEST(ImageField, RandomResizedCropEqualsResampleOfTheFullDecode) {
  // Output at least half the crop on an axis: no DCT scaling, and the region
  // decode is the full decode's pixels (image_decoder.h), so rows are exact.
  ImageOutputSpec spec;
  spec.out_height = 24;
  spec.out_width = 20;
  spec.crop = CropMode::kRandomResized;
  spec.random_flip = true;
  spec.layout = Layout::kCHW;
  for (ColorMode mode : {ColorMode::kRgb, ColorMode::kGray}) {
    const ImageFieldDecoder d(mode, spec, "f");
    for (const Encoded& e : {jpeg(45, 38, 5), png(40, 47, 6), webp(43, 39, 8, -1),
                              webp(41, 45, 9, 75)}) {
      for (size_t row = 0; row < 12; ++row) {
        EXPECT_EQ(decode_row(d, e, at(1, row)), expected_row(d, spec, e, mode, at(1, row)))
            << row;
      }
    }
  }
}

TEST(ImageField, RandomResizedWindowsFollowTheRowPosition) {
  ImageOutputSpec spec;
  spec.out_height = spec.out_width = 16;
  spec.crop = CropMode::kRandomResized;
  const ImageFieldDecoder d(ColorMode::kRgb, spec, "f");
  const auto window = [&](const RowPosition& p) {
    const Box b = d.placement(300, 400, p).area.box;
    return std::vector<double>{b.y0, b.x0, b.y1, b.x1};
  };
  EXPECT_EQ(window(at(2, 3)), window(at(2, 3)));
  EXPECT_NE(window(at(2, 3)), window(at(2, 4)));
  EXPECT_NE(window(at(2, 3)), window(at(3, 3)));
  EXPECT_NE(window(at(2, 3)), window(at(2, 3, 8)));
  // The engine's draw is torchvision's get_params on the row's generator.
  Rng rng(at(2, 3).derive());
  const Window w = random_resized_crop(300, 400, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, rng);
  EXPECT_EQ(window(at(2, 3)), (std::vector<double>{static_cast<double>(w.y),
                                                   static_cast<double>(w.x),
                                                   static_cast<double>(w.y + w.height),
                                                   static_cast<double>(w.x + w.width)}));
}

TEST(ImageField, CenterAndRandomCropsCoverTheOutput) {
  const Encoded e = jpeg(30, 50, 7);
  ImageOutputSpec spec;
  spec.out_height = 16;
  spec.out_width = 16;
  for (CropMode crop : {CropMode::kCenter, CropMode::kRandom, CropMode::kNone}) {
    spec.crop = crop;
    const ImageFieldDecoder d(ColorMode::kRgb, spec, "f");
    for (size_t row = 0; row < 6; ++row) {
      EXPECT_EQ(decode_row(d, e, at(0, row)),
                expected_row(d, spec, e, ColorMode::kRgb, at(0, row)));
    }
  }
  // Centre: cover 30x50 -> 16x27, the crop at column (27 - 16) / 2 = 5.
  spec.crop = CropMode::kCenter;
  const SourceArea a =
      ImageFieldDecoder(ColorMode::kRgb, spec, "f").placement(30, 50, at(0, 0)).area;
  EXPECT_DOUBLE_EQ(a.box.x0, 5 * 50.0 / 27);
  EXPECT_DOUBLE_EQ(a.box.y1, 30.0);
  // Eval: torchvision's Resize(20) then CenterCrop(16).
  spec.resize = 20;
  const SourceArea eval =
      ImageFieldDecoder(ColorMode::kRgb, spec, "f").placement(30, 50, at(0, 0)).area;
  const SourceArea want = resize_center_crop(30, 50, 20, 16, 16);
  EXPECT_DOUBLE_EQ(eval.box.x0, want.box.x0);
  EXPECT_DOUBLE_EQ(eval.box.y0, want.box.y0);
  EXPECT_DOUBLE_EQ(eval.box.x1, want.box.x1);
  EXPECT_DOUBLE_EQ(eval.box.y1, want.box.y1);
}

TEST(ImageField, SpecsThatCannotWorkAreUsageErrors) {
  const auto refused = [](const ImageOutputSpec& spec) {
    const auto error = test::error_from([&] { ImageFieldDecoder(ColorMode::kRgb, spec, "img"); });
    return error.has_value() && error->kind() == ErrorKind::kUsage &&
           std::string(error->what()).find("'img'") != std::string::npos;
  };
  ImageOutputSpec spec;
  spec.normalize = true;  // uint8 output
  EXPECT_TRUE(refused(spec));
  spec = ImageOutputSpec{};
  spec.out_height = 10;  // no width
  EXPECT_TRUE(refused(spec));
  spec = ImageOutputSpec{};
  spec.crop = CropMode::kRandomResized;  // no size
  EXPECT_TRUE(refused(spec));
  spec.out_height = spec.out_width = 10;
  spec.scale_min = 0.9;
  spec.scale_max = 0.1;
  EXPECT_TRUE(refused(spec));
  spec = ImageOutputSpec{};
  spec.out_height = spec.out_width = 10;
  spec.crop = CropMode::kNone;
  spec.resize = 12;  // resize with a plain resize
  EXPECT_TRUE(refused(spec));
  spec.crop = CropMode::kCenter;
  spec.resize = 8;  // smaller than the crop
  EXPECT_TRUE(refused(spec));
  spec.resize = 12;
  EXPECT_FALSE(refused(spec));
}

TEST(ImageField, CorruptBytesAreDataErrors) {
  const Encoded e = jpeg(64, 64, 8);
  ImageOutputSpec spec;
  spec.out_height = spec.out_width = 16;
  spec.crop = CropMode::kRandomResized;
  const ImageFieldDecoder d(ColorMode::kRgb, spec, "f");
  const ProbedField p = probe(d, e);
  std::vector<uint8_t> out(16 * 16 * 3);
  // Cut in the first rows: whatever window is drawn needs rows that are gone.
  const Encoded cut{std::vector<uint8_t>(e.bytes.begin(), e.bytes.begin() + 700), 64, 64};
  const auto error = test::error_from(
      [&] { d.decode(cut.bytes.data(), cut.bytes.size(), p, at(0, 0), out.data()); });
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->kind(), ErrorKind::kData);
  const std::vector<uint8_t> junk(100, 0x42);
  ProbedField q;
  const auto bad = test::error_from([&] { d.probe(junk.data(), junk.size(), q); });
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->kind(), ErrorKind::kData);
}

}  // namespace
}  // namespace chute

// Test-only: small images encoded in memory by the codec libraries
// themselves, for the decoder and field tests (image_decoder_test.cc,
// image_field_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>  // before jpeglib.h, which uses FILE
#include <cstdlib>
#include <vector>

#include <jpeglib.h>
#include <png.h>
#include <webp/encode.h>

namespace chute::test {

// An h x w RGB image of smooth waves plus a little hash noise: compresses
// like a photo, and every pixel differs from its neighbours.
inline std::vector<uint8_t> photo(int h, int w, int seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(h) * w * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        const double wave = std::sin(0.11 * (c + 1) * x + seed) * std::cos(0.07 * (c + 2) * y);
        const uint32_t hash = (static_cast<uint32_t>(x) * 73856093u) ^
                              (static_cast<uint32_t>(y) * 19349663u) ^
                              (static_cast<uint32_t>(c) * 83492791u) ^ static_cast<uint32_t>(seed);
        const double v = 128 + 100 * wave + static_cast<double>(hash % 17) - 8;
        rgb[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>(std::lround(std::fmin(255.0, std::fmax(0.0, v))));
      }
    }
  }
  return rgb;
}

inline std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& rgb, int h, int w) {
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr err{};
  cinfo.err = jpeg_std_error(&err);  // the default error_exit: a test image never fails
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(w);
  cinfo.image_height = static_cast<JDIMENSION>(h);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 90, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(&rgb[static_cast<size_t>(cinfo.next_scanline) * w * 3]);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + size);
  std::free(buffer);
  return out;
}

inline std::vector<uint8_t> encode_png(const std::vector<uint8_t>& rgb, int h, int w) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(w);
  image.height = static_cast<png_uint_32>(h);
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  EXPECT_TRUE(png_image_write_get_memory_size(image, size, 0, rgb.data(), 0, nullptr));
  std::vector<uint8_t> out(size);
  EXPECT_TRUE(png_image_write_to_memory(&image, out.data(), &size, 0, rgb.data(), 0, nullptr));
  out.resize(size);
  return out;
}

// Lossless when quality < 0, else lossy at that quality (0 to 100).
inline std::vector<uint8_t> encode_webp(const std::vector<uint8_t>& rgb, int h, int w,
                                        float quality = -1) {
  uint8_t* buffer = nullptr;
  const size_t size = quality < 0 ? WebPEncodeLosslessRGB(rgb.data(), w, h, w * 3, &buffer)
                                  : WebPEncodeRGB(rgb.data(), w, h, w * 3, quality, &buffer);
  EXPECT_GT(size, 0u);
  std::vector<uint8_t> out(buffer, buffer + size);
  WebPFree(buffer);
  return out;
}

}  // namespace chute::test

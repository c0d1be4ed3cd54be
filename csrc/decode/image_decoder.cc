#include "decode/image_decoder.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace chute {
namespace {

constexpr uint8_t kJpegMagic[] = {0xFF, 0xD8, 0xFF};
constexpr uint8_t kPngMagic[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

bool starts_with(const uint8_t* data, size_t size, const uint8_t* magic, size_t n) {
  return size >= n && std::memcmp(data, magic, n) == 0;
}

// The first bytes in hex, so that an error about an unknown format shows what
// the member actually holds (HTML error page, gzip, WebP, ...).
std::string leading_bytes(const uint8_t* data, size_t size) {
  std::string out;
  char buf[4];
  for (size_t i = 0; i < size && i < 8; ++i) {
    std::snprintf(buf, sizeof(buf), i ? " %02x" : "%02x", data[i]);
    out += buf;
  }
  return out;
}

ImageFormat sniff(const uint8_t* data, size_t size, const std::string& where) {
  if (starts_with(data, size, kJpegMagic, sizeof(kJpegMagic))) return ImageFormat::kJpeg;
  if (starts_with(data, size, kPngMagic, sizeof(kPngMagic))) return ImageFormat::kPng;
  CHUTE_CHECK(size > 0, kData, At{where} << "empty image data");
  CHUTE_CHECK(false, kData,
              At{where} << "not a JPEG or PNG image (" << size << " bytes starting with "
                    << leading_bytes(data, size) << ")");
  return ImageFormat::kJpeg;  // unreachable
}

// Pillow's MULDIV255: a*b/255 rounded, without a division.
inline int muldiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

inline uint8_t luma(int r, int g, int b) {
  return static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

}  // namespace

namespace {
std::atomic<int64_t> g_max_image_pixels{kDefaultMaxImagePixels};
}  // namespace

void set_max_image_pixels(int64_t pixels) { g_max_image_pixels.store(pixels < 0 ? 0 : pixels); }

int64_t max_image_pixels() { return g_max_image_pixels.load(std::memory_order_relaxed); }

const char* image_format_name(ImageFormat format) {
  return format == ImageFormat::kJpeg ? "jpeg" : "png";
}

ImageInfo probe_image(const uint8_t* data, size_t size, const std::string& where) {
  return sniff(data, size, where) == ImageFormat::kJpeg ? detail::probe_jpeg(data, size, where)
                                                         : detail::probe_png(data, size, where);
}

void decode_image(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                  const std::string& where) {
  if (sniff(data, size, where) == ImageFormat::kJpeg) {
    detail::decode_jpeg(data, size, mode, out, where);
  } else {
    detail::decode_png(data, size, mode, out, where);
  }
}

void decode_image_rows(const uint8_t* data, size_t size, ColorMode mode, RowSink& sink,
                       const std::string& where) {
  const ImageFormat format = sniff(data, size, where);
  if (format == ImageFormat::kJpeg) {
    detail::decode_jpeg_rows(data, size, mode, sink, where);
    return;
  }
  // PNG rows come out of libpng one by one too, but Adam7 interlacing needs
  // the whole image; PNG is not the hot path, so it decodes whole and hands
  // the image over as one band.
  const ImageInfo info = detail::probe_png(data, size, where);
  const int channels = mode == ColorMode::kRgb ? 3 : 1;
  thread_local std::vector<uint8_t> whole;
  whole.resize(static_cast<size_t>(info.height) * info.width * channels);
  detail::decode_png(data, size, mode, whole.data(), where);
  sink.begin(info.height, info.width, channels);
  sink.rows(whole.data(), static_cast<size_t>(info.width) * channels, 0, info.height);
}

RegionDecodeInfo decode_image_resampled(const uint8_t* data, size_t size, ColorMode mode,
                                        const SourceArea& area, const ResampleOutput& out,
                                        RegionDecode how, const std::string& where) {
  const ImageFormat format = sniff(data, size, where);
  if (format == ImageFormat::kJpeg && how != RegionDecode::kFull) {
    return detail::decode_jpeg_resampled(data, size, mode, area, out,
                                         how == RegionDecode::kCropScaled, where);
  }
  const ImageInfo info = format == ImageFormat::kJpeg ? detail::probe_jpeg(data, size, where)
                                                       : detail::probe_png(data, size, where);
  const Window& r = area.region;
  CHUTE_CHECK(r.y >= 0 && r.x >= 0 && r.y + r.height <= info.height &&
                  r.x + r.width <= info.width,
              kUsage,
              At{where} << "resample region " << r.height << "x" << r.width << " at (" << r.y
                    << ", " << r.x << ") does not fit the " << info.height << "x" << info.width
                    << " image");
  Resampler resampler(area, mode == ColorMode::kRgb ? 3 : 1, out);
  decode_image_rows(data, size, mode, resampler, where);
  resampler.finish();
  return {8, Window{0, 0, info.height, info.width}};
}

namespace detail {

void check_image_size(const char* format, int64_t width, int64_t height,
                      const std::string& where) {
  CHUTE_CHECK(width > 0 && height > 0, kData,
              At{where} << format << " header declares an empty image (" << width << "x"
                    << height << ")");
  // Checked before any pixel memory exists: a 15000x15000 header in a
  // 640 KiB member would otherwise ask for 645 MiB (a decompression bomb).
  const int64_t limit = max_image_pixels();
  CHUTE_CHECK(limit <= 0 || width <= limit / height, kData,
              At{where} << format << " image is " << width << "x" << height << " = "
                    << width * height << " pixels, above the limit of " << limit
                    << " pixels (a decompression bomb guard, as Pillow's; "
                       "chute.set_max_image_pixels() changes it)");
}

void rgb_to_l(const uint8_t* rgb, uint8_t* l, size_t pixels) {
  for (size_t i = 0; i < pixels; ++i, rgb += 3) l[i] = luma(rgb[0], rgb[1], rgb[2]);
}

void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, size_t pixels) {
  for (size_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const int nk = 255 - cmyk[3];
    // nk - muldiv255(c, nk) lies in [0, nk]: Pillow's CLIP8 never bites here.
    rgb[0] = static_cast<uint8_t>(nk - muldiv255(cmyk[0], nk));
    rgb[1] = static_cast<uint8_t>(nk - muldiv255(cmyk[1], nk));
    rgb[2] = static_cast<uint8_t>(nk - muldiv255(cmyk[2], nk));
  }
}

void cmyk_to_l(const uint8_t* cmyk, uint8_t* l, size_t pixels) {
  // Pillow has no direct CMYK -> L; convert("L") goes through RGB.
  for (size_t i = 0; i < pixels; ++i, cmyk += 4) {
    const int nk = 255 - cmyk[3];
    l[i] = luma(nk - muldiv255(cmyk[0], nk), nk - muldiv255(cmyk[1], nk),
                nk - muldiv255(cmyk[2], nk));
  }
}

void gray_to_rgb(const uint8_t* gray, uint8_t* rgb, size_t pixels) {
  for (size_t i = 0; i < pixels; ++i, rgb += 3) rgb[0] = rgb[1] = rgb[2] = gray[i];
}

}  // namespace detail
}  // namespace chute

#include "decode/image_decoder.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "decode/jpeg_decoder.h"
#include "decode/png_decoder.h"
#include "decode/webp_decoder.h"

namespace chute {
namespace detail {
namespace {

// The formats chute decodes natively, one row each (see ImageCodec). A new
// format is a decoder file pair (its functions) and a row here.
constexpr ImageCodec kCodecs[] = {
    {"jpeg", "JPEG", "jpg jpeg", is_jpeg, probe_jpeg, decode_jpeg, decode_jpeg_rows,
     decode_jpeg_region},
    {"png", "PNG", "png", is_png, probe_png, decode_png, nullptr, nullptr},
    {"webp", "WebP", "webp", is_webp, probe_webp, decode_webp, nullptr, decode_webp_region},
};

// "JPEG, PNG or WebP".
std::string format_titles() {
  std::string out;
  constexpr size_t n = sizeof(kCodecs) / sizeof(kCodecs[0]);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += i + 1 < n ? ", " : " or ";
    out += kCodecs[i].title;
  }
  return out;
}

// The first bytes in hex, so that an error about an unknown format shows what
// the member actually holds (HTML error page, gzip, GIF, ...).
std::string leading_bytes(const uint8_t* data, size_t size) {
  std::string out;
  char buf[4];
  for (size_t i = 0; i < size && i < 8; ++i) {
    std::snprintf(buf, sizeof(buf), i ? " %02x" : "%02x", data[i]);
    out += buf;
  }
  return out;
}

// Pillow's MULDIV255: a*b/255 rounded, without a division.
inline int muldiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

inline uint8_t luma(int r, int g, int b) {
  return static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

std::atomic<int64_t> g_max_image_pixels{kDefaultMaxImagePixels};

// The image whole, in a per-thread buffer, handed to `sink` as one band: for
// formats whose decoder does not produce rows as it goes (PNG's Adam7
// interlacing needs the whole image; libwebp's one-call decode).
void decode_whole_rows(const ImageCodec& codec, const uint8_t* data, size_t size, ColorMode mode,
                       RowSink& sink, const std::string& where) {
  const ImageSize image = codec.probe(data, size, where);
  const int channels = mode == ColorMode::kRgb ? 3 : 1;
  thread_local ScratchBuffer whole;
  uint8_t* pixels = whole.get(static_cast<size_t>(image.height) * image.width * channels);
  codec.decode(data, size, mode, pixels, where);
  sink.begin(image.height, image.width, channels);
  sink.rows(pixels, static_cast<size_t>(image.width) * channels, 0, image.height);
}

void decode_rows(const ImageCodec& codec, const uint8_t* data, size_t size, ColorMode mode,
                 RowSink& sink, const std::string& where) {
  if (codec.decode_rows != nullptr) {
    codec.decode_rows(data, size, mode, sink, where);
  } else {
    decode_whole_rows(codec, data, size, mode, sink, where);
  }
}

}  // namespace

const ImageCodec& sniff_image(const uint8_t* data, size_t size, const std::string& where) {
  for (const ImageCodec& codec : kCodecs) {
    if (codec.sniff(data, size)) return codec;
  }
  CHUTE_CHECK(size > 0, kData, At{where} << "empty image data");
  CHUTE_CHECK(false, kData,
              At{where} << "not a " << format_titles() << " image (" << size
                    << " bytes starting with " << leading_bytes(data, size) << ")");
  return kCodecs[0];  // unreachable
}

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

void check_region(const Window& r, int height, int width, const std::string& where) {
  CHUTE_CHECK(r.y >= 0 && r.x >= 0 && r.height > 0 && r.width > 0 && r.y + r.height <= height &&
                  r.x + r.width <= width,
              kUsage,
              At{where} << "resample region " << r.height << "x" << r.width << " at (" << r.y
                    << ", " << r.x << ") does not fit the " << height << "x" << width
                    << " image");
}

uint8_t* ScratchBuffer::get(size_t bytes) {
  if (bytes_.capacity() > kKeepBytes) std::vector<uint8_t>().swap(bytes_);
  bytes_.resize(bytes);
  return bytes_.data();
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

}  // namespace detail

void set_max_image_pixels(int64_t pixels) {
  detail::g_max_image_pixels.store(pixels < 0 ? 0 : pixels);
}

int64_t max_image_pixels() {
  return detail::g_max_image_pixels.load(std::memory_order_relaxed);
}

std::vector<ImageFormat> image_formats() {
  std::vector<ImageFormat> formats;
  for (const detail::ImageCodec& codec : detail::kCodecs) {
    ImageFormat format{codec.name, codec.title, {}, codec.decode_region != nullptr};
    std::string extensions = codec.extensions;
    for (size_t start = 0; start < extensions.size();) {
      const size_t end = std::min(extensions.find(' ', start), extensions.size());
      if (end > start) format.extensions.push_back(extensions.substr(start, end - start));
      start = end + 1;
    }
    formats.push_back(std::move(format));
  }
  return formats;
}

ImageInfo probe_image(const uint8_t* data, size_t size, const std::string& where) {
  const detail::ImageCodec& codec = detail::sniff_image(data, size, where);
  const detail::ImageSize image = codec.probe(data, size, where);
  return {codec.name, image.width, image.height};
}

void decode_image(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                  const std::string& where) {
  detail::sniff_image(data, size, where).decode(data, size, mode, out, where);
}

RegionDecodeInfo decode_image_resampled(const uint8_t* data, size_t size, ColorMode mode,
                                        const SourceArea& area, const ResampleOutput& out,
                                        RegionDecode how, const std::string& where) {
  const detail::ImageCodec& codec = detail::sniff_image(data, size, where);
  if (codec.decode_region != nullptr && how != RegionDecode::kFull) {
    return codec.decode_region(data, size, mode, area, out, how == RegionDecode::kCropScaled,
                               where);
  }
  const detail::ImageSize image = codec.probe(data, size, where);
  detail::check_region(area.region, image.height, image.width, where);
  Resampler resampler(area, mode == ColorMode::kRgb ? 3 : 1, out);
  detail::decode_rows(codec, data, size, mode, resampler, where);
  resampler.finish();
  return {8, Window{0, 0, image.height, image.width}};
}

}  // namespace chute

// WebP through libwebp's advanced decoding API (WebPDecode with a
// WebPDecoderConfig), into caller memory.
//
// What the output must equal is Pillow's Image.open(...).convert("RGB"/"L").
// Pillow decodes a still WebP with libwebp's defaults (fancy upsampling, no
// dithering) to RGBA, or RGBX without alpha; convert("RGB") then drops alpha
// without compositing, so libwebp's own RGB output is the same pixels, and
// convert("L") is the luma of those (rgb_to_l). Pillow ignores ICC profiles
// when converting, and so do we.
//
// libwebp's one-call decode allocates its decoder state per image and frees
// it before returning: there is no per-thread handle to keep, only the
// per-thread scratch memory below.
#include "decode/webp_decoder.h"

#include <algorithm>
#include <cstring>

#include <webp/decode.h>

#include "core/error.h"

namespace chute::detail {
namespace {

// A crop decode treats its first and last rows and columns as the image's
// edges (chroma upsampling mirrors there instead of reading the neighbour),
// so it is widened by this many pixels on each side, outside what the
// resample reads; and started at even coordinates, where a lossy image's
// 2x2-subsampled chroma grid starts.
constexpr int kCropMargin = 4;

const char* status_text(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OK:
      return "";
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "truncated (not enough data)";
  }
  return "unknown error";
}

void check_status(VP8StatusCode status, const char* what, const std::string& where) {
  CHUTE_CHECK(status != VP8_STATUS_OUT_OF_MEMORY, kMemory,
              At{where} << "out of memory decoding a WebP image");
  CHUTE_CHECK(status == VP8_STATUS_OK, kData, At{where} << what << Detail{status_text(status)});
}

WebPBitstreamFeatures read_features(const uint8_t* data, size_t size, const std::string& where) {
  WebPBitstreamFeatures features;
  check_status(WebPGetFeatures(data, size, &features), "corrupt WebP header", where);
  // Pillow shows an animation's first frame, composed on its canvas by
  // libwebp's demuxing decoder (libwebpdemux), which chute does not link.
  CHUTE_CHECK(!features.has_animation, kData,
              At{where} << "animated WebP is not supported (only still images)");
  check_image_size("WebP", features.width, features.height, where);
  return features;
}

// The configuration of one decode, whose output buffer libwebp may have
// allocated (never with external memory, but freeing it is always allowed).
class Config {
 public:
  explicit Config(const std::string& where) {
    CHUTE_CHECK(WebPInitDecoderConfig(&config_), kIo,
                At{where} << "libwebp's decoder does not match the headers chute was built with");
  }
  ~Config() { WebPFreeDecBuffer(&config_.output); }
  Config(const Config&) = delete;
  Config& operator=(const Config&) = delete;

  // RGB rows of `window` (the whole image, or a crop) into `rgb`, which holds
  // window.height rows of window.width * 3 bytes.
  void decode_rgb(const uint8_t* data, size_t size, const Window& window, bool crop,
                  uint8_t* rgb, const std::string& where) {
    WebPDecoderOptions& options = config_.options;
    if (crop) {
      options.use_cropping = 1;
      options.crop_left = window.x;
      options.crop_top = window.y;
      options.crop_width = window.width;
      options.crop_height = window.height;
    }
    WebPDecBuffer& output = config_.output;
    output.colorspace = MODE_RGB;
    output.is_external_memory = 1;
    output.u.RGBA.rgba = rgb;
    output.u.RGBA.stride = window.width * 3;
    output.u.RGBA.size = static_cast<size_t>(window.width) * 3 * window.height;
    check_status(WebPDecode(data, size, &config_), "corrupt WebP", where);
  }

 private:
  WebPDecoderConfig config_{};
};

}  // namespace

bool is_webp(const uint8_t* data, size_t size) {
  // A RIFF container ("RIFF", the size, then the form type "WEBP").
  return size >= 12 && std::memcmp(data, "RIFF", 4) == 0 && std::memcmp(data + 8, "WEBP", 4) == 0;
}

ImageSize probe_webp(const uint8_t* data, size_t size, const std::string& where) {
  const WebPBitstreamFeatures features = read_features(data, size, where);
  return {features.width, features.height};
}

void decode_webp(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                 const std::string& where) {
  const WebPBitstreamFeatures features = read_features(data, size, where);
  const Window whole{0, 0, features.height, features.width};
  const size_t pixels = static_cast<size_t>(features.width) * features.height;
  Config config(where);
  if (mode == ColorMode::kRgb) {
    config.decode_rgb(data, size, whole, false, out, where);
    return;
  }
  thread_local ScratchBuffer rgb;
  uint8_t* decoded = rgb.get(pixels * 3);
  config.decode_rgb(data, size, whole, false, decoded, where);
  rgb_to_l(decoded, out, pixels);
}

RegionDecodeInfo decode_webp_region(const uint8_t* data, size_t size, ColorMode mode,
                                    const SourceArea& area, const ResampleOutput& out,
                                    bool /*scaled*/, const std::string& where) {
  const WebPBitstreamFeatures features = read_features(data, size, where);
  check_region(area.region, features.height, features.width, where);
  const int channels = mode == ColorMode::kRgb ? 3 : 1;
  Resampler resampler(area, channels, out);
  const Window need = resampler.needed();
  const int x0 = std::max(0, need.x - kCropMargin) & ~1;
  const int y0 = std::max(0, need.y - kCropMargin) & ~1;
  const int x1 = std::min(features.width, need.x + need.width + kCropMargin);
  const int y1 = std::min(features.height, need.y + need.height + kCropMargin);
  const Window crop{y0, x0, y1 - y0, x1 - x0};
  const size_t pixels = static_cast<size_t>(crop.width) * crop.height;
  thread_local ScratchBuffer rgb;
  uint8_t* decoded = rgb.get(pixels * 3);
  Config config(where);
  config.decode_rgb(data, size, crop, true, decoded, where);
  if (mode == ColorMode::kGray) rgb_to_l(decoded, decoded, pixels);
  resampler.set_column_origin(crop.x);
  resampler.begin(features.height, crop.width, channels);
  resampler.rows(decoded, static_cast<size_t>(crop.width) * channels, crop.y, crop.height);
  resampler.finish();
  return {8, crop};
}

}  // namespace chute::detail

// PNG through libpng, reading from memory.
//
// libpng's errors longjmp out of its C frames (our error function never
// returns). As in jpeg_decoder.cc, every libpng call sits in a "guarded"
// function whose frame holds only trivially destructible locals, and the C++
// caller turns a failure into a CHUTE_CHECK naming `where`.
//
// What the output must equal is Pillow's Image.open(...).convert("RGB"/"L"):
//  - gray, gray+alpha, RGB, RGBA, palette, at 1/2/4/8 bits: alpha and tRNS are
//    dropped, not composited; low bit depths are scaled (2-bit x85, 4-bit x17,
//    1-bit 0/255), which libpng's expansion also does;
//  - 16-bit RGB, RGBA and gray+alpha: Pillow keeps the high byte of each
//    sample (rawmodes "RGB;16B", "RGBA;16B", "LA;16B"), as png_set_strip_16;
//  - 16-bit gray opens as "I;16", whose conversion to L or RGB clips at 255
//    (a value of 256 becomes 255, not 1). We reproduce that clip.
//  - convert("L") of color images is the luma formula on the RGB pixels
//    (palette entries included), not libpng's rgb_to_gray.
// Pillow ignores gAMA/cHRM/iCCP when converting, and so do we.
#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <png.h>
#include <zlib.h>

#include "core/error.h"
#include "decode/png_decoder.h"

namespace chute::detail {
namespace {

struct ErrorState {
  std::jmp_buf jump;
  char message[256];
};

[[noreturn]] void on_error(png_structp png, png_const_charp message) {
  auto* err = static_cast<ErrorState*>(png_get_error_ptr(png));
  std::snprintf(err->message, sizeof(err->message), "%s", message ? message : "unknown error");
  std::longjmp(err->jump, 1);
}

// Warnings (and benign errors, which we downgrade to warnings) leave the
// pixels intact: bad ancillary data, an over-long zlib stream, an odd sRGB
// profile. Pillow does not report them either.
void on_warning(png_structp /*png*/, png_const_charp /*message*/) {}

struct MemoryInput {
  const uint8_t* data;
  size_t size;
  size_t pos;
};

void read_from_memory(png_structp png, png_bytep dst, png_size_t length) {
  auto* in = static_cast<MemoryInput*>(png_get_io_ptr(png));
  if (length > in->size - in->pos) png_error(png, "truncated PNG data (unexpected end of file)");
  std::memcpy(dst, in->data + in->pos, length);
  in->pos += length;
}

enum class RowConversion : uint8_t {
  kNone,          // libpng writes the output format directly into `out`
  kRgbToL,        // 8-bit RGB rows, then Pillow's convert("L")
  kGray16ToL,     // big-endian 16-bit gray, clipped at 255 (Pillow's I;16 -> L)
  kGray16ToRgb,   // the same, replicated
};

struct Plan {
  RowConversion conversion;
  int out_channels;
  size_t src_row_bytes;  // what libpng writes per row after its transformations
};

void convert_row(RowConversion conversion, const uint8_t* src, uint8_t* dst, int width) {
  switch (conversion) {
    case RowConversion::kNone:
      break;
    case RowConversion::kRgbToL:
      rgb_to_l(src, dst, width);
      break;
    case RowConversion::kGray16ToL:
      for (int i = 0; i < width; ++i) dst[i] = src[2 * i] ? 255 : src[2 * i + 1];
      break;
    case RowConversion::kGray16ToRgb:
      for (int i = 0; i < width; ++i) {
        dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = src[2 * i] ? 255 : src[2 * i + 1];
      }
      break;
  }
}

struct Header {
  png_uint_32 width;
  png_uint_32 height;
  int bit_depth;
  int color_type;
  int interlace;
  bool has_trns;
};

struct ReadJob {
  Plan plan;
  int width;
  int height;
  bool interlaced;
  uint8_t* out;
  uint8_t* scratch;    // one row, or the whole image when interlaced
  png_bytep* rows;     // height row pointers when interlaced
};

// libpng cannot reset a read struct for a new image, so the structs live one
// image; what is reused per thread is the scratch memory (see ThreadBuffers).
class PngReader {
 public:
  PngReader(const uint8_t* data, size_t size) : input_{data, size, 0} {
    png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, &err_, on_error, on_warning);
    if (png_) info_ = png_create_info_struct(png_);
  }
  ~PngReader() { png_destroy_read_struct(&png_, info_ ? &info_ : nullptr, nullptr); }
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;

  bool created() const { return png_ && info_; }
  const char* message() const { return err_.message; }

  static bool guarded_read_info(PngReader* r, Header* h) {
    if (setjmp(r->err_.jump)) return false;
    png_set_read_fn(r->png_, &r->input_, read_from_memory);
    // Pillow rejects a bad CRC in any chunk before the image data; libpng's
    // default only warns for ancillary chunks.
    png_set_crc_action(r->png_, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);
    png_set_benign_errors(r->png_, 1);
    png_read_info(r->png_, r->info_);
    png_get_IHDR(r->png_, r->info_, &h->width, &h->height, &h->bit_depth, &h->color_type,
                 &h->interlace, nullptr, nullptr);
    h->has_trns = png_get_valid(r->png_, r->info_, PNG_INFO_tRNS) != 0;
    return true;
  }

  // Sets libpng's transformations for `mode`; returns the row size libpng
  // will then produce in *row_bytes.
  static bool guarded_transform(PngReader* r, const Header* h, ColorMode mode, bool gray16,
                                size_t* row_bytes, int* channels) {
    if (setjmp(r->err_.jump)) return false;
    png_structp png = r->png_;
    if (!gray16) {
      if (h->bit_depth == 16) png_set_strip_16(png);
      if (h->color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
      if (h->color_type == PNG_COLOR_TYPE_GRAY && h->bit_depth < 8) {
        png_set_expand_gray_1_2_4_to_8(png);
      }
      // After expansion: drops real alpha and the alpha that palette
      // expansion makes from tRNS.
      png_set_strip_alpha(png);
      const bool gray_source = (h->color_type & PNG_COLOR_MASK_COLOR) == 0;
      if (gray_source && mode == ColorMode::kRgb) png_set_gray_to_rgb(png);
    }
    if (h->interlace != PNG_INTERLACE_NONE) png_set_interlace_handling(png);
    png_read_update_info(png, r->info_);
    *row_bytes = png_get_rowbytes(png, r->info_);
    *channels = png_get_channels(png, r->info_);
    return true;
  }

  static bool guarded_read(PngReader* r, const ReadJob* job) {
    if (setjmp(r->err_.jump)) return false;
    const Plan& plan = job->plan;
    const size_t out_row = static_cast<size_t>(job->width) * plan.out_channels;
    if (job->interlaced) {
      // Adam7 revisits every row on each pass, so the rows must all exist.
      png_read_image(r->png_, job->rows);
      if (plan.conversion != RowConversion::kNone) {
        for (int y = 0; y < job->height; ++y) {
          convert_row(plan.conversion, job->rows[y], job->out + y * out_row, job->width);
        }
      }
    } else {
      for (int y = 0; y < job->height; ++y) {
        uint8_t* dst = job->out + y * out_row;
        if (plan.conversion == RowConversion::kNone) {
          png_read_row(r->png_, dst, nullptr);
        } else {
          png_read_row(r->png_, job->scratch, nullptr);
          convert_row(plan.conversion, job->scratch, dst, job->width);
        }
      }
    }
    // Chunks after the image data are not read: Pillow does not check them
    // either, and a missing IEND after complete pixel data loses nothing.
    return true;
  }

 private:
  ErrorState err_{};
  MemoryInput input_;
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
};

struct ThreadBuffers {
  std::vector<uint8_t> scratch;
  std::vector<png_bytep> rows;
};

// Kept across images so that steady state allocates nothing, but not without
// bound: one huge interlaced image must not pin its size for the thread's life.
ThreadBuffers& thread_buffers() {
  constexpr size_t kKeepBytes = size_t{64} << 20;
  thread_local ThreadBuffers buffers;
  if (buffers.scratch.capacity() > kKeepBytes) std::vector<uint8_t>().swap(buffers.scratch);
  if (buffers.rows.capacity() * sizeof(png_bytep) > kKeepBytes) {
    std::vector<png_bytep>().swap(buffers.rows);
  }
  return buffers;
}

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

bool valid_depth(int color_type, int bit_depth) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
      return bit_depth == 1 || bit_depth == 2 || bit_depth == 4 || bit_depth == 8 ||
             bit_depth == 16;
    case PNG_COLOR_TYPE_PALETTE:
      return bit_depth == 1 || bit_depth == 2 || bit_depth == 4 || bit_depth == 8;
    case PNG_COLOR_TYPE_RGB:
    case PNG_COLOR_TYPE_GRAY_ALPHA:
    case PNG_COLOR_TYPE_RGB_ALPHA:
      return bit_depth == 8 || bit_depth == 16;
    default:
      return false;
  }
}

constexpr uint8_t kMagic[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

}  // namespace

bool is_png(const uint8_t* data, size_t size) {
  return size >= sizeof(kMagic) && std::memcmp(data, kMagic, sizeof(kMagic)) == 0;
}

ImageSize probe_png(const uint8_t* data, size_t size, const std::string& where) {
  // Signature (8), then IHDR: length (4), type (4), 13 bytes of fields, CRC (4).
  // Parsed by hand: libpng's png_read_info would read every chunk up to the
  // pixel data (and inflate compressed text and ICC profiles) to get here.
  constexpr size_t kEnd = 8 + 8 + 13 + 4;
  CHUTE_CHECK(size >= kEnd, kData,
              At{where} << "corrupt PNG header: truncated (" << size << " bytes)");
  const uint8_t* chunk = data + 8;
  CHUTE_CHECK(read_be32(chunk) == 13 && std::memcmp(chunk + 4, "IHDR", 4) == 0, kData,
              At{where} << "corrupt PNG header: the first chunk is not a 13-byte IHDR");
  const uint32_t crc = static_cast<uint32_t>(crc32(0, chunk + 4, 4 + 13));
  CHUTE_CHECK(crc == read_be32(chunk + 8 + 13), kData,
              At{where} << "corrupt PNG header: IHDR CRC mismatch");
  const uint32_t width = read_be32(chunk + 8);
  const uint32_t height = read_be32(chunk + 12);
  const int bit_depth = chunk[16];
  const int color_type = chunk[17];
  CHUTE_CHECK(valid_depth(color_type, bit_depth), kData,
              At{where} << "corrupt PNG header: bit depth " << bit_depth
                    << " is invalid for color type " << color_type);
  check_image_size("PNG", width, height, where);
  return {static_cast<int>(width), static_cast<int>(height)};
}

void decode_png(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                const std::string& where) {
  PngReader reader(data, size);
  CHUTE_CHECK(reader.created(), kIo, At{where} << "cannot create a PNG decoder (out of memory)");
  Header h{};
  bool ok = PngReader::guarded_read_info(&reader, &h);
  CHUTE_CHECK(ok, kData, At{where} << "corrupt PNG" << Detail{reader.message()});
  check_image_size("PNG", h.width, h.height, where);

  const bool gray16 = h.color_type == PNG_COLOR_TYPE_GRAY && h.bit_depth == 16;
  Plan plan{};
  plan.out_channels = mode == ColorMode::kRgb ? 3 : 1;
  int expect_channels;
  if (gray16) {
    plan.conversion = mode == ColorMode::kRgb ? RowConversion::kGray16ToRgb
                                              : RowConversion::kGray16ToL;
    expect_channels = 1;
  } else if ((h.color_type & PNG_COLOR_MASK_COLOR) != 0 && mode == ColorMode::kGray) {
    plan.conversion = RowConversion::kRgbToL;  // palette included: expanded to RGB first
    expect_channels = 3;
  } else {
    plan.conversion = RowConversion::kNone;
    expect_channels = plan.out_channels;
  }
  size_t row_bytes = 0;
  int channels = 0;
  ok = PngReader::guarded_transform(&reader, &h, mode, gray16, &row_bytes, &channels);
  CHUTE_CHECK(ok, kData, At{where} << "corrupt PNG" << Detail{reader.message()});
  plan.src_row_bytes =
      static_cast<size_t>(h.width) * expect_channels * (gray16 ? 2 : 1);
  // A mismatch would be our bug, not the file's; never write past `out`.
  CHUTE_CHECK(channels == expect_channels && row_bytes == plan.src_row_bytes, kData,
              At{where} << "PNG (color type " << h.color_type << ", bit depth " << h.bit_depth
                    << ") decodes to " << channels << " channels and " << row_bytes
                    << " bytes per row, expected " << expect_channels << " and "
                    << plan.src_row_bytes);

  ReadJob job{};
  job.plan = plan;
  job.width = static_cast<int>(h.width);
  job.height = static_cast<int>(h.height);
  job.interlaced = h.interlace != PNG_INTERLACE_NONE;
  job.out = out;
  ThreadBuffers& buffers = thread_buffers();
  if (job.interlaced) {
    buffers.rows.resize(h.height);
    const size_t out_row = static_cast<size_t>(h.width) * plan.out_channels;
    if (plan.conversion == RowConversion::kNone) {
      for (png_uint_32 y = 0; y < h.height; ++y) buffers.rows[y] = out + y * out_row;
    } else {
      buffers.scratch.resize(plan.src_row_bytes * h.height);
      for (png_uint_32 y = 0; y < h.height; ++y) {
        buffers.rows[y] = buffers.scratch.data() + y * plan.src_row_bytes;
      }
    }
    job.rows = buffers.rows.data();
  } else if (plan.conversion != RowConversion::kNone) {
    buffers.scratch.resize(plan.src_row_bytes);
    job.scratch = buffers.scratch.data();
  }
  ok = PngReader::guarded_read(&reader, &job);
  CHUTE_CHECK(ok, kData, At{where} << "corrupt PNG" << Detail{reader.message()});
}

}  // namespace chute::detail

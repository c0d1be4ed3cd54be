// JPEG through the libjpeg API of libjpeg-turbo.
//
// libjpeg reports errors by calling error_exit, whose default calls exit().
// We longjmp out of it instead. C++ exceptions must not unwind through
// libjpeg's C frames, and longjmp must not skip C++ destructors, so every
// libjpeg call happens inside a small "guarded" function whose frame holds
// only trivially destructible locals; it returns false on error and the C++
// caller turns the saved message into a CHUTE_CHECK that names `where`.
#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <jpeglib.h>
// jerror.h after jpeglib.h: it needs JMESSAGE's context to declare the codes.
#include <jerror.h>

#include "core/error.h"
#include "decode/jpeg_decoder.h"

namespace chute::detail {
namespace {

// A progressive JPEG may hold any number of scans, each re-running the whole
// image's coefficient pass; a few KiB of crafted scans can cost minutes.
// Real encoders write about 10. TurboJPEG's own guard uses 500.
constexpr int kMaxScans = 500;

struct ErrorManager {
  jpeg_error_mgr pub;  // first: libjpeg sees only this part
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings that mean the pixels are wrong. libjpeg carries on after them and
// returns gray or smeared blocks; Pillow raises "image file is truncated" for
// truncation and we want a loud error (that on_error can skip) for all of them.
// Left as warnings: JWRN_EXTRANEOUS_DATA (stray bytes before a marker, common
// in real datasets such as ImageNet, pixels intact, Pillow accepts them),
// JWRN_ADOBE_XFORM / JWRN_JFIF_MAJOR (unknown versions, pixels intact),
// JWRN_BOGUS_ICC (only the ICC profile, which we do not use, is affected).
bool is_corrupt_data_warning(int code) {
  switch (code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
    case JWRN_MUST_RESYNC:
    case JWRN_NOT_SEQUENTIAL:
    case JWRN_BOGUS_PROGRESSION:
      return true;
    default:
      return false;
  }
}

void emit_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;  // trace output
  if (is_corrupt_data_warning(cinfo->err->msg_code)) error_exit(cinfo);
  cinfo->err->num_warnings++;
}

void limit_scans(j_common_ptr cinfo) {
  auto* dinfo = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (dinfo->input_scan_number > kMaxScans) {
    auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
    std::snprintf(err->message, sizeof(err->message), "more than %d progressive scans",
                  kMaxScans);
    std::longjmp(err->jump, 1);
  }
}

// How libjpeg's output rows become ours.
enum class RowConversion : uint8_t {
  kNone,      // libjpeg writes the output format directly into `out`
  kRgbToL,    // RGB rows, then Pillow's convert("L")
  kCmykToRgb, // inverted (Adobe) CMYK rows, then Pillow's convert("RGB")
  kCmykToL,
};

// A few rows that are written and read back at once. libjpeg-turbo's SIMD
// color converters store a row that starts on a 16/32-byte boundary with
// non-temporal stores (movntdq), which go around the cache: right for a large
// output, wrong here, where the reader then waits on DRAM for every row (most
// of a small image's decode time: benchmarks/README.md, "Measurements behind
// code choices"). Rows therefore start 8 bytes past a cache line, which sends
// libjpeg down its ordinary-store path.
class RowBuffer {
 public:
  void reserve(size_t row_bytes, int rows) {
    stride_ = (row_bytes + kLine - 1) / kLine * kLine;
    bytes_.resize(stride_ * static_cast<size_t>(rows) + kLine + kMisalign);
    const auto base = reinterpret_cast<uintptr_t>(bytes_.data());
    const size_t pad = (kLine - base % kLine) % kLine;
    row0_ = bytes_.data() + pad + kMisalign;
  }
  uint8_t* row(int r) const { return row0_ + static_cast<size_t>(r) * stride_; }
  size_t stride() const { return stride_; }

 private:
  static constexpr size_t kLine = 64;
  static constexpr size_t kMisalign = 8;
  std::vector<uint8_t> bytes_;
  size_t stride_ = 0;
  uint8_t* row0_ = nullptr;
};

struct DecodeJob {
  J_COLOR_SPACE out_space;
  RowConversion conversion;
  int out_channels;
  uint8_t* out;        // the whole image, HWC; unused with a sink
  RowSink* sink;       // receives each group of rows from `band` instead
  uint8_t* band;       // kMaxRowsPerCall output rows, for the sink
  size_t band_stride;
  uint8_t* scratch;    // rows_per_call rows of libjpeg output when converting
  size_t scratch_stride;
};

void convert_rows(const DecodeJob& job, uint8_t* scratch, int rows, int width, uint8_t* dst,
                  size_t dst_stride) {
  for (int r = 0; r < rows; ++r) {
    uint8_t* src = scratch + static_cast<size_t>(r) * job.scratch_stride;
    uint8_t* d = dst + r * dst_stride;
    switch (job.conversion) {
      case RowConversion::kNone:
        break;
      case RowConversion::kRgbToL:
        rgb_to_l(src, d, width);
        break;
      case RowConversion::kCmykToRgb:
      case RowConversion::kCmykToL:
        // Adobe writes CMYK inverted; Pillow reads it with rawmode "CMYK;I".
        for (int i = 0; i < width * 4; ++i) src[i] = static_cast<uint8_t>(255 - src[i]);
        if (job.conversion == RowConversion::kCmykToRgb) {
          cmyk_to_rgb(src, d, width);
        } else {
          cmyk_to_l(src, d, width);
        }
        break;
    }
  }
}

class JpegDecoder {
 public:
  JpegDecoder() {
    cinfo_.err = jpeg_std_error(&err_.pub);
    err_.pub.error_exit = error_exit;
    err_.pub.emit_message = emit_message;
    progress_.progress_monitor = limit_scans;
    created_ = guarded_create(this);
    CHUTE_CHECK(created_, kIo, "cannot create a JPEG decoder: " << err_.message);
    cinfo_.progress = &progress_;
  }
  ~JpegDecoder() {
    if (created_) jpeg_destroy_decompress(&cinfo_);
  }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  ImageSize probe(const uint8_t* data, size_t size, const std::string& where) {
    Session session(this);
    read_header(data, size, where);
    return {static_cast<int>(cinfo_.image_width), static_cast<int>(cinfo_.image_height)};
  }

  // Into `out` (whole image), or group by group into `sink` when it is set.
  void decode(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out, RowSink* sink,
              const std::string& where) {
    Session session(this);
    read_header(data, size, where);
    DecodeJob job = plan_job(mode, where);
    job.out = out;
    job.sink = sink;
    if (sink != nullptr) {
      // Output size before jpeg_start_decompress: no scaling is requested,
      // so it is the header's size.
      const int height = static_cast<int>(cinfo_.image_height);
      const int width = static_cast<int>(cinfo_.image_width);
      sink->begin(height, width, job.out_channels);
      reserve_band(&job, width);
    }
    const bool ok = guarded_decode(this, &job);
    CHUTE_CHECK(ok, kData, At{where} << "corrupt JPEG" << Detail{err_.message});
  }

  // Entropy decoding alone: every coefficient, with no inverse DCT,
  // upsampling or colour conversion. No crop or DCT scale avoids this part of
  // a decode for the rows it keeps, so it bounds what region decoding can gain.
  void entropy_decode(const uint8_t* data, size_t size, const std::string& where) {
    Session session(this);
    read_header(data, size, where);
    const bool ok = guarded_read_coefficients(this);
    CHUTE_CHECK(ok, kData, At{where} << "corrupt JPEG" << Detail{err_.message});
  }

  // Only what the resample of `area` reads: its rows (those above are
  // skipped, those below never decoded) and its columns widened to the iMCU
  // boundary, optionally at a DCT scale M/8.
  RegionDecodeInfo decode_resampled(const uint8_t* data, size_t size, ColorMode mode,
                                    const SourceArea& area, const ResampleOutput& out,
                                    bool dct_scaling, const std::string& where) {
    Session session(this);
    read_header(data, size, where);
    const int full_h = static_cast<int>(cinfo_.image_height);
    const int full_w = static_cast<int>(cinfo_.image_width);
    check_region(area.region, full_h, full_w, where);
    DecodeJob job = plan_job(mode, where);
    const int scale = dct_scaling ? pick_scale(area.box, out.height, out.width) : 8;
    cinfo_.scale_num = static_cast<unsigned>(scale);
    cinfo_.scale_denom = 8;
    bool ok = guarded_calc_output(this, &job);
    CHUTE_CHECK(ok, kData, At{where} << "corrupt JPEG" << Detail{err_.message});
    const int scaled_h = static_cast<int>(cinfo_.output_height);
    const int scaled_w = static_cast<int>(cinfo_.output_width);
    Resampler resampler(scale_area(area, scale, scaled_h, scaled_w), job.out_channels, out);
    const Window need = resampler.needed();
    // Chroma upsampling at a cropped edge replicates the edge sample instead
    // of reading its neighbour, which changes the outermost pixels; a few
    // columns more on each side keep that outside what the resample reads.
    const int first = std::max(0, need.x - kCropMargin);
    const int end = std::min(scaled_w, need.x + need.width + kCropMargin);
    JDIMENSION x = static_cast<JDIMENSION>(first);
    JDIMENSION width = static_cast<JDIMENSION>(end - first);
    ok = guarded_start_cropped(this, &x, &width);
    CHUTE_CHECK(ok, kData, At{where} << "corrupt JPEG" << Detail{err_.message});
    resampler.set_column_origin(static_cast<int>(x));
    resampler.begin(scaled_h, static_cast<int>(width), job.out_channels);
    job.sink = &resampler;
    reserve_band(&job, static_cast<int>(width));
    ok = guarded_decode_rows(this, &job, static_cast<JDIMENSION>(need.y),
                             static_cast<JDIMENSION>(need.y + need.height));
    CHUTE_CHECK(ok, kData, At{where} << "corrupt JPEG" << Detail{err_.message});
    resampler.finish();
    return {scale, Window{need.y, static_cast<int>(x), need.height, static_cast<int>(width)}};
  }

 private:
  static constexpr int kMaxRowsPerCall = 16;
  // Columns decoded past each side of a crop (the upsampler's context is one
  // chroma sample, at most 2 pixels).
  static constexpr int kCropMargin = 4;

  // Returns the decompressor to its idle state however the call ends, so
  // that the thread's next image starts clean.
  class Session {
   public:
    explicit Session(JpegDecoder* d) : d_(d) {}
    ~Session() { jpeg_abort_decompress(&d_->cinfo_); }
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

   private:
    JpegDecoder* d_;
  };

  // The output color space and the conversion after libjpeg, from the
  // header's color space and the requested mode.
  DecodeJob plan_job(ColorMode mode, const std::string& where) {
    DecodeJob job{};
    job.out_channels = mode == ColorMode::kRgb ? 3 : 1;
    switch (cinfo_.jpeg_color_space) {
      case JCS_GRAYSCALE:
        // Pillow opens these as "L": convert("RGB") replicates, which
        // libjpeg-turbo's gray -> RGB output does.
        job.out_space = mode == ColorMode::kRgb ? JCS_RGB : JCS_GRAYSCALE;
        job.conversion = RowConversion::kNone;
        break;
      case JCS_YCbCr:
      case JCS_RGB:
        // Not JCS_GRAYSCALE for kGray: that is the stored Y channel, while
        // Pillow computes L from the decoded (rounded) RGB.
        job.out_space = JCS_RGB;
        job.conversion = mode == ColorMode::kRgb ? RowConversion::kNone : RowConversion::kRgbToL;
        break;
      case JCS_CMYK:
      case JCS_YCCK:
        job.out_space = JCS_CMYK;  // libjpeg turns YCCK into CMYK
        job.conversion =
            mode == ColorMode::kRgb ? RowConversion::kCmykToRgb : RowConversion::kCmykToL;
        break;
      default:
        CHUTE_CHECK(false, kData,
                    At{where} << "unsupported JPEG color space (" << cinfo_.num_components
                          << " components)");
    }
    if (job.conversion != RowConversion::kNone) {
      // libjpeg hands out up to rec_outbuf_height rows per call; 4 covers every
      // sampling factor and leaves room for a later change of settings. The
      // header's width bounds every scaled or cropped width.
      scratch_.reserve(static_cast<size_t>(cinfo_.image_width) *
                           (job.out_space == JCS_CMYK ? 4 : 3),
                       kMaxRowsPerCall);
      job.scratch = scratch_.row(0);
      job.scratch_stride = scratch_.stride();
    }
    return job;
  }

  void reserve_band(DecodeJob* job, int width) {
    band_.reserve(static_cast<size_t>(width) * job->out_channels, kMaxRowsPerCall);
    job->band = band_.row(0);
    job->band_stride = band_.stride();
  }

  // The smallest M in {1, 2, 4} whose M/8-scaled box still covers the
  // output, else 8. libjpeg-turbo has SIMD inverse DCTs for those sizes only;
  // at 5/8, 6/8 and 7/8 its plain C ones make the decode slower than at full
  // size (benchmarks/README.md, "Transforms").
  static int pick_scale(const Box& box, int out_h, int out_w) {
    const double h = box.y1 - box.y0;
    const double w = box.x1 - box.x0;
    for (int m = 1; m < 8; m *= 2) {
      if (h * m >= 8.0 * out_h && w * m >= 8.0 * out_w) return m;
    }
    return 8;
  }

  // `area` in the pixels of the image decoded at scale/8 (scaled_h x scaled_w,
  // libjpeg's rounded-up size). Scaled pixel i covers full pixels
  // [8i/M, 8(i+1)/M) (each 8x8 block becomes MxM), so the box scales exactly
  // and the region widens to the scaled pixels it touches.
  static SourceArea scale_area(const SourceArea& area, int scale, int scaled_h, int scaled_w) {
    if (scale == 8) return area;
    const double f = scale / 8.0;
    const Window& r = area.region;
    const int y0 = static_cast<int>(std::floor(r.y * f));
    const int x0 = static_cast<int>(std::floor(r.x * f));
    const int y1 = std::min(scaled_h, static_cast<int>(std::ceil((r.y + r.height) * f)));
    const int x1 = std::min(scaled_w, static_cast<int>(std::ceil((r.x + r.width) * f)));
    SourceArea scaled;
    scaled.region = Window{y0, x0, y1 - y0, x1 - x0};
    scaled.box = Box{area.box.y0 * f, area.box.x0 * f, std::min<double>(area.box.y1 * f, y1),
                     std::min<double>(area.box.x1 * f, x1)};
    return scaled;
  }

  void read_header(const uint8_t* data, size_t size, const std::string& where) {
    const bool ok = guarded_read_header(this, data, size);
    CHUTE_CHECK(ok, kData, At{where} << "corrupt JPEG header" << Detail{err_.message});
    check_image_size("JPEG", cinfo_.image_width, cinfo_.image_height, where);
  }

  // The guarded functions: no locals with destructors (see the top of the file).
  static bool guarded_create(JpegDecoder* d) {
    if (setjmp(d->err_.jump)) return false;
    jpeg_create_decompress(&d->cinfo_);
    return true;
  }

  static bool guarded_read_header(JpegDecoder* d, const uint8_t* data, size_t size) {
    if (setjmp(d->err_.jump)) return false;
    jpeg_mem_src(&d->cinfo_, data, static_cast<unsigned long>(size));
    jpeg_read_header(&d->cinfo_, TRUE);
    return true;
  }

  static void set_output_options(j_decompress_ptr c, const DecodeJob* job) {
    c->out_color_space = job->out_space;
    // Pillow's settings; both are libjpeg's defaults, set anyway so that
    // nothing upstream can change what "pixel-identical" means.
    c->dct_method = JDCT_ISLOW;
    c->do_fancy_upsampling = TRUE;
    c->do_block_smoothing = TRUE;
  }

  // The sink runs inside this frame, between libjpeg calls: an exception it
  // throws unwinds only C++ frames, and Session then aborts the decompressor.
  static bool guarded_decode(JpegDecoder* d, const DecodeJob* job) {
    if (setjmp(d->err_.jump)) return false;
    j_decompress_ptr c = &d->cinfo_;
    set_output_options(c, job);
    jpeg_start_decompress(c);
    read_rows(c, job, c->output_height);
    // Reads up to EOI: a file cut after the last scan still warns JPEG_EOF.
    jpeg_finish_decompress(c);
    return true;
  }

  static bool guarded_read_coefficients(JpegDecoder* d) {
    if (setjmp(d->err_.jump)) return false;
    jpeg_read_coefficients(&d->cinfo_);
    jpeg_finish_decompress(&d->cinfo_);
    return true;
  }

  // The output size at the requested scale, before decoding starts.
  static bool guarded_calc_output(JpegDecoder* d, const DecodeJob* job) {
    if (setjmp(d->err_.jump)) return false;
    set_output_options(&d->cinfo_, job);
    jpeg_calc_output_dimensions(&d->cinfo_);
    return true;
  }

  // Starts decoding and limits it to columns [*x, *x + *width), which
  // libjpeg widens to the left to an iMCU boundary (the real ones come back).
  static bool guarded_start_cropped(JpegDecoder* d, JDIMENSION* x, JDIMENSION* width) {
    if (setjmp(d->err_.jump)) return false;
    j_decompress_ptr c = &d->cinfo_;
    jpeg_start_decompress(c);
    if (*width < c->output_width) jpeg_crop_scanline(c, x, width);
    return true;
  }

  // Rows [first, end) into the sink; the decompressor is then abandoned
  // (Session aborts it), so rows below `end` are never decoded.
  static bool guarded_decode_rows(JpegDecoder* d, const DecodeJob* job, JDIMENSION first,
                                  JDIMENSION end) {
    if (setjmp(d->err_.jump)) return false;
    j_decompress_ptr c = &d->cinfo_;
    if (first > 0) jpeg_skip_scanlines(c, first);
    read_rows(c, job, end);
    return true;
  }

  // Reads from the current scanline up to `end`, into job->out or the sink.
  // Called only from guarded frames (libjpeg may longjmp out of it).
  static void read_rows(j_decompress_ptr c, const DecodeJob* job, JDIMENSION end) {
    const int width = static_cast<int>(c->output_width);
    const size_t out_row = static_cast<size_t>(width) * job->out_channels;
    const int batch = c->rec_outbuf_height < kMaxRowsPerCall ? c->rec_outbuf_height
                                                             : kMaxRowsPerCall;
    JSAMPROW rows[kMaxRowsPerCall];
    while (c->output_scanline < end) {
      const JDIMENSION y = c->output_scanline;
      int want = static_cast<int>(end - y);
      if (want > batch) want = batch;
      uint8_t* dst = job->sink != nullptr ? job->band : job->out + y * out_row;
      const size_t dst_stride = job->sink != nullptr ? job->band_stride : out_row;
      for (int r = 0; r < want; ++r) {
        rows[r] = job->conversion == RowConversion::kNone
                      ? dst + r * dst_stride
                      : job->scratch + static_cast<size_t>(r) * job->scratch_stride;
      }
      const int got = static_cast<int>(jpeg_read_scanlines(c, rows, want));
      if (job->conversion != RowConversion::kNone) {
        convert_rows(*job, job->scratch, got, width, dst, dst_stride);
      }
      if (job->sink != nullptr && got > 0) {
        job->sink->rows(dst, dst_stride, static_cast<int>(y), got);
      }
    }
  }

  jpeg_decompress_struct cinfo_{};
  ErrorManager err_{};
  jpeg_progress_mgr progress_{};
  bool created_ = false;
  RowBuffer scratch_;
  RowBuffer band_;
};

// One decompressor per thread, reused: creating one allocates its memory
// pools and tables, which costs more than decoding a small thumbnail.
JpegDecoder& thread_decoder() {
  thread_local JpegDecoder decoder;
  return decoder;
}

constexpr uint8_t kMagic[] = {0xFF, 0xD8, 0xFF};

}  // namespace

bool is_jpeg(const uint8_t* data, size_t size) {
  return size >= sizeof(kMagic) && std::memcmp(data, kMagic, sizeof(kMagic)) == 0;
}

ImageSize probe_jpeg(const uint8_t* data, size_t size, const std::string& where) {
  return thread_decoder().probe(data, size, where);
}

void decode_jpeg(const uint8_t* data, size_t size, ColorMode mode, uint8_t* out,
                 const std::string& where) {
  thread_decoder().decode(data, size, mode, out, nullptr, where);
}

void decode_jpeg_rows(const uint8_t* data, size_t size, ColorMode mode, RowSink& sink,
                      const std::string& where) {
  thread_decoder().decode(data, size, mode, nullptr, &sink, where);
}

void entropy_decode_jpeg(const uint8_t* data, size_t size, const std::string& where) {
  thread_decoder().entropy_decode(data, size, where);
}

RegionDecodeInfo decode_jpeg_region(const uint8_t* data, size_t size, ColorMode mode,
                                    const SourceArea& area, const ResampleOutput& out,
                                    bool scaled, const std::string& where) {
  return thread_decoder().decode_resampled(data, size, mode, area, out, scaled, where);
}

}  // namespace chute::detail

// Antialiased bilinear resampling of 8-bit images (1 or 3 channels), fused
// with crop, horizontal flip and the output layout/dtype write.
//
// The filter is Pillow's BILINEAR as Image.resize(..., reducing_gap=None)
// applies it: a triangle whose support grows with the reduction factor, two
// separable passes with the intermediate rounded to uint8, taps clamped to
// the readable source. Weights are 16-bit fixed point (Pillow uses 22 bits),
// so an output byte differs from Pillow's by at most 1. The SIMD kernels
// (SSE4.1, AVX2, picked at run time) and the scalar one compute the same
// integers, so their results are identical.
//
// The horizontal pass costs several times more per pixel than the vertical
// one, so it runs on whichever side has fewer rows: first (on every source
// row) when the image grows vertically, second (on the output rows) when it
// shrinks; the order is picked from an estimate of both (Pillow up to 12
// always runs it first; Pillow 13 also switches for some size pairs). The
// two orders round differently, which is within the bound above.
//
// Rows are consumed as a stream (RowSink): each output row is finished and
// written as soon as its last source row is in, so a decoder can feed rows
// straight from its buffers and no whole-image copy exists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "image/pixel_format.h"
#include "image/row_sink.h"

namespace chute {

// A rectangle of whole pixels.
struct Window {
  int y = 0;
  int x = 0;
  int height = 0;
  int width = 0;
};

// A rectangle in continuous pixel coordinates (pixel i spans [i, i + 1)).
struct Box {
  double y0 = 0;
  double x0 = 0;
  double y1 = 0;
  double x1 = 0;
};

// What an output is resampled from, in source pixels. `box` is the area that
// is stretched onto the output; `region` holds the pixels the filter may read,
// and the filter's edges clamp to it. torchvision's resized_crop (crop, then
// resize) is region = box = the crop window; Resize then CenterCrop is
// region = the whole image, box = the crop's preimage (see crop_params.h).
struct SourceArea {
  Window region;
  Box box;
};

// The area that is exactly `window` (crop, then resize).
SourceArea crop_area(const Window& window);

enum class SimdLevel : uint8_t { kAuto, kScalar, kSse41, kAvx2 };
enum class PassOrder : uint8_t { kAuto, kHorizontalFirst, kVerticalFirst };

// The best level this CPU runs (kAuto resolved).
SimdLevel best_simd_level();

struct ResampleOutput {
  int height = 0;
  int width = 0;
  bool flip = false;                     // mirror horizontally
  const OutputFormat* format = nullptr;  // layout and dtype; must outlive the resampler
  void* data = nullptr;                  // height * width * channels elements
  // kScalar etc. force a kernel (tests, benchmarks); kScalar also keeps the
  // float output writes to their per-value loop.
  SimdLevel simd = SimdLevel::kAuto;
  PassOrder order = PassOrder::kAuto;    // forced by tests; results differ by at most 1
};

struct AxisTaps;           // resample_taps.h
struct ResampleKernelSet;  // resample_kernels.h

class Resampler final : public RowSink {
 public:
  // kUsage unless channels is 1 or 3, the output size is positive, and the
  // box is non-empty and inside the region. The source's size is checked in begin().
  Resampler(const SourceArea& area, int channels, const ResampleOutput& out);
  ~Resampler();
  Resampler(const Resampler&) = delete;
  Resampler& operator=(const Resampler&) = delete;

  // The source pixels the output depends on (within area.region): a decoder
  // need only produce these rows and columns.
  Window needed() const { return needed_; }

  // The rows passed to rows() start at source column `x` instead of 0 (a
  // decoder that produced only some columns). Call before begin().
  void set_column_origin(int x) { column_origin_ = x; }

  // height and width: the source rows that exist and the columns each row
  // holds (from the column origin). kData unless they cover needed() and the
  // channel count matches.
  void begin(int height, int width, int channels) override;
  // Source rows, in order; rows outside needed() are ignored.
  void rows(const uint8_t* hwc, size_t stride, int first_row, int count) override;
  // kData unless every output row was written (the source ended early).
  void finish() const;

 private:
  // A source row (region-relative) at the first needed column: in the
  // caller's band while rows() runs, else copied into the ring.
  const uint8_t* source_row(int r) const;
  uint8_t* ring_slot(int r) { return &ring_[static_cast<size_t>(r % ring_rows_) * ring_stride_]; }
  void horizontal(const uint8_t* row, int available, uint8_t* dst) const;
  void emit_ready_rows();
  void emit_row_horizontal_first(int y);
  void emit_row_vertical_first(int y);
  void write_horizontal(const uint8_t* row, int available, int y);
  void write_pending_rows();
  void write_output_row(const uint8_t* row, int y) const;

  SourceArea area_;
  int channels_;
  ResampleOutput out_;
  std::shared_ptr<const AxisTaps> tx_;
  std::shared_ptr<const AxisTaps> ty_;
  Window needed_;
  bool vertical_first_ = false;
  int column_origin_ = 0;
  int available_pixels_ = 0;  // readable source pixels from the first needed column
  bool begun_ = false;
  int next_source_row_ = 0;  // relative to the region: the next row expected
  int next_output_row_ = 0;
  // The rows() call in progress: its rows [band_first_, band_end_) (region-relative).
  const uint8_t* band_ = nullptr;
  size_t band_stride_ = 0;
  int band_first_ = 0;
  int band_end_ = 0;
  // Horizontal first: resampled rows (out width); vertical first: source
  // rows (needed width) that later output rows still read. A ring of slots.
  size_t ring_stride_ = 0;
  int ring_rows_ = 0;
  int ring_pixels_ = 0;  // readable pixels in a ring slot (vertical first)
  std::vector<uint8_t> ring_;
  // Vertical first: the vertical pass's rows, `pending_` of them waiting for
  // the horizontal pass, which takes batch_rows_ rows at once (RGB, where
  // the CPU's kernels have such a loop) or one.
  int batch_rows_ = 1;
  std::vector<uint8_t> mid_rows_;
  int pending_ = 0;
  size_t out_stride_ = 0;
  std::vector<uint8_t> out_row_;  // batch_rows_ rows of the output's width
  std::vector<const uint8_t*> tap_rows_;
  std::vector<int> first_tap_from_;  // per output row y: the least first tap of rows >= y
  const ResampleKernelSet* kernels_;
};

// The whole-image form: `hwc` is h x w x c (c = 1 or 3, rows packed),
// resampled from `area` (a crop, or e.g. a resize-then-center-crop
// preimage) into `out`.
void resample_area_into(const uint8_t* hwc, int h, int w, int c, const SourceArea& area,
                        const ResampleOutput& out);

}  // namespace chute

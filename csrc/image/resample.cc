#include "image/resample.h"

#include <algorithm>

#include "core/error.h"
#include "image/resample_kernels.h"
#include "image/resample_taps.h"

namespace chute {

SourceArea crop_area(const Window& window) {
  return {window, Box{static_cast<double>(window.y), static_cast<double>(window.x),
                      static_cast<double>(window.y) + window.height,
                      static_cast<double>(window.x) + window.width}};
}

namespace {

// [first, end) of the source pixels an axis reads.
void taps_extent(const AxisTaps& t, int* first, int* end) {
  *first = t.start[0];
  *end = t.start[0] + t.count[0];
  for (int o = 1; o < t.out_size; ++o) {
    *first = std::min(*first, t.start[o]);
    *end = std::max(*end, t.start[o] + t.count[o]);
  }
}

// Ring slots the vertical pass needs. Output rows are finished in order, as
// soon as their last row has arrived, so when row y is finished the ring
// holds everything from its first tap up to the furthest last tap of rows
// 0..y; a row stays until that many newer rows have overwritten it.
int ring_rows_needed(const AxisTaps& t) {
  int furthest = 0;
  int rows = 1;
  for (int o = 0; o < t.out_size; ++o) {
    furthest = std::max(furthest, t.start[o] + t.count[o]);
    rows = std::max(rows, furthest - t.start[o]);
  }
  return rows;
}

}  // namespace

Resampler::Resampler(const SourceArea& area, int channels, const ResampleOutput& out)
    : area_(area), channels_(channels), out_(out) {
  CHUTE_CHECK(channels == 1 || channels == 3, kUsage,
              "resample of " << channels << " channels (1 or 3 expected)");
  CHUTE_CHECK(out.height > 0 && out.width > 0, kUsage,
              "resample to " << out.height << "x" << out.width);
  CHUTE_CHECK(out.format != nullptr && out.data != nullptr, kUsage, "resample without an output");
  const Window& r = area.region;
  const Box& b = area.box;
  CHUTE_CHECK(r.y >= 0 && r.x >= 0 && r.height > 0 && r.width > 0 && b.y0 >= r.y &&
                  b.x0 >= r.x && b.y0 < b.y1 && b.x0 < b.x1 &&
                  b.y1 <= static_cast<double>(r.y) + r.height &&
                  b.x1 <= static_cast<double>(r.x) + r.width,
              kUsage,
              "resample box (" << b.y0 << ", " << b.x0 << ")-(" << b.y1 << ", " << b.x1
                               << ") is not inside the region " << r.height << "x" << r.width
                               << " at (" << r.y << ", " << r.x << ")");
  tx_ = axis_taps(r.width, b.x0 - r.x, b.x1 - r.x, out.width);
  ty_ = axis_taps(r.height, b.y0 - r.y, b.y1 - r.y, out.height);
  kernels_ = &resample_kernels(out.simd);
  int x_first, x_end, y_first, y_end;
  taps_extent(*tx_, &x_first, &x_end);
  taps_extent(*ty_, &y_first, &y_end);
  needed_ = Window{r.y + y_first, r.x + x_first, y_end - y_first, x_end - x_first};
  next_source_row_ = y_first;
  const size_t row_bytes = static_cast<size_t>(out.width) * channels;
  ring_stride_ = (row_bytes + kKernelRowSlack + 63) / 64 * 64;
  ring_rows_ = ring_rows_needed(*ty_);
  ring_.resize(ring_stride_ * ring_rows_);
  out_row_.resize(ring_stride_);
  tap_rows_.resize(ty_->max_count);
}

Resampler::~Resampler() = default;

void Resampler::begin(int height, int width, int channels) {
  CHUTE_CHECK(channels == channels_, kData,
              "source has " << channels << " channels, the resample expects " << channels_);
  CHUTE_CHECK(needed_.y + needed_.height <= height && needed_.x >= column_origin_ &&
                  needed_.x + needed_.width <= column_origin_ + width,
              kData,
              "source of " << height << " rows and columns [" << column_origin_ << ", "
                           << column_origin_ + width << ") lacks the pixels the resample reads ("
                           << needed_.height << "x" << needed_.width << " at (" << needed_.y
                           << ", " << needed_.x << "))");
  available_pixels_ = column_origin_ + width - needed_.x;
  begun_ = true;
}

void Resampler::rows(const uint8_t* hwc, size_t stride, int first_row, int count) {
  CHUTE_CHECK(begun_, kUsage, "Resampler::rows before begin");
  const int region_end = needed_.y + needed_.height - area_.region.y;
  for (int i = 0; i < count; ++i) {
    const int r = first_row + i - area_.region.y;
    if (r < needed_.y - area_.region.y || r >= region_end) continue;
    CHUTE_CHECK(r == next_source_row_, kData,
                "source row " << first_row + i << " arrived, expected "
                              << next_source_row_ + area_.region.y);
    take_row(hwc + i * stride + static_cast<size_t>(needed_.x - column_origin_) * channels_);
  }
}

void Resampler::take_row(const uint8_t* row) {
  const int origin = needed_.x - area_.region.x;
  if (ty_->copy && tx_->copy && !out_.flip) {
    // A pure crop: the source row's slice is the output row.
    out_.format->write_row(row + static_cast<size_t>(tx_->start[0] - origin) * channels_,
                           channels_, out_.height, out_.width, next_output_row_, out_.data);
    ++next_source_row_;
    ++next_output_row_;
    return;
  }
  uint8_t* slot = &ring_[static_cast<size_t>(next_source_row_ % ring_rows_) * ring_stride_];
  const HorizontalKernel horizontal =
      channels_ == 3 ? kernels_->horizontal_rgb : kernels_->horizontal_gray;
  horizontal(row, origin, available_pixels_, *tx_, out_.flip, slot);
  ++next_source_row_;
  emit_ready_rows();
}

void Resampler::emit_ready_rows() {
  const AxisTaps& t = *ty_;
  const size_t bytes = static_cast<size_t>(out_.width) * channels_;
  auto slot = [this](int r) {
    return &ring_[static_cast<size_t>(r % ring_rows_) * ring_stride_];
  };
  while (next_output_row_ < out_.height) {
    const int y = next_output_row_;
    const int first = t.start[y];
    const int n = t.count[y];
    if (first + n > next_source_row_) return;
    const uint8_t* result;
    if (t.copy) {
      result = slot(first);
    } else {
      for (int k = 0; k < n; ++k) tap_rows_[k] = slot(first + k);
      kernels_->vertical(tap_rows_.data(), &t.weights[static_cast<size_t>(y) * t.stride], n,
                         t.precision, bytes, out_row_.data());
      result = out_row_.data();
    }
    out_.format->write_row(result, channels_, out_.height, out_.width, y, out_.data);
    ++next_output_row_;
  }
}

void Resampler::finish() const {
  CHUTE_CHECK(next_output_row_ == out_.height, kData,
              "the source ended after " << next_source_row_ + area_.region.y
                                        << " rows, before every output row was complete");
}

void resample_area_into(const uint8_t* hwc, int h, int w, int c, const SourceArea& area,
                        const ResampleOutput& out) {
  Resampler resampler(area, c, out);
  resampler.begin(h, w, c);
  resampler.rows(hwc, static_cast<size_t>(w) * c, 0, h);
  resampler.finish();
}

void resample_into(const uint8_t* hwc, int h, int w, int c, const Window& crop, int out_h,
                   int out_w, bool flip, const OutputFormat& fmt, void* out, SimdLevel simd) {
  CHUTE_CHECK(crop.y >= 0 && crop.x >= 0 && crop.height > 0 && crop.width > 0 &&
                  crop.y + crop.height <= h && crop.x + crop.width <= w,
              kUsage,
              "crop " << crop.height << "x" << crop.width << " at (" << crop.y << ", " << crop.x
                      << ") does not fit a " << h << "x" << w << " image");
  ResampleOutput target;
  target.height = out_h;
  target.width = out_w;
  target.flip = flip;
  target.format = &fmt;
  target.data = out;
  target.simd = simd;
  resample_area_into(hwc, h, w, c, crop_area(crop), target);
}

}  // namespace chute

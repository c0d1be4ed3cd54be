#include "image/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/transform_clock.h"
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

double mean_taps(const AxisTaps& t) {
  double sum = 0;
  for (int o = 0; o < t.out_size; ++o) sum += t.count[o];
  return sum / t.out_size;
}

// Whether running the vertical pass first costs less, by a count of the
// kernels' vector operations: a horizontal output pixel costs ~10 plus ~7
// per group of 4 taps (RGB; gray takes 8 taps a group); 32 bytes of a
// vertical row ~10 plus ~17 per pair of taps; vertical first also copies the
// source rows a later output row needs when the rows arrive in bands, and
// runs the RGB horizontal pass on several rows at once, which sets up each
// pixel's taps once for them all. A function of the geometry alone (not of
// the CPU's kernels), so that every machine picks the same order and
// produces the same bytes.
bool prefer_vertical_first(const AxisTaps& tx, const AxisTaps& ty, const Window& needed,
                           int channels) {
  const double taps_per_group = channels == 3 ? 4.0 : 8.0;
  const double groups = std::ceil(mean_taps(tx) / taps_per_group);
  const double h_pixel = 10 + 7 * groups;
  const double h_pixel_rows = channels == 3 ? 4 + 5 * groups : h_pixel;
  const double v_byte = (10 + 17 * std::ceil(mean_taps(ty) / 2)) / 32;
  const double out_h = ty.out_size;
  const double out_w = tx.out_size;
  const double horizontal_first =
      needed.height * out_w * h_pixel + out_h * out_w * channels * v_byte;
  const double vertical_first = out_h * needed.width * channels * v_byte +
                                out_h * out_w * h_pixel_rows +
                                needed.height * needed.width * channels / 16.0;
  return vertical_first < horizontal_first;
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
  switch (out.order) {
    case PassOrder::kHorizontalFirst:
      vertical_first_ = false;
      break;
    case PassOrder::kVerticalFirst:
      vertical_first_ = true;
      break;
    case PassOrder::kAuto:
      // A copy axis costs nothing either way; only a real vertical pass
      // can make going first pay.
      vertical_first_ = !ty_->copy && !tx_->copy &&
                        prefer_vertical_first(*tx_, *ty_, needed_, channels);
      break;
  }
  // Every row buffer is padded for the horizontal kernels' stores.
  const size_t ring_bytes =
      static_cast<size_t>(vertical_first_ ? needed_.width : out.width) * channels;
  ring_stride_ = (ring_bytes + kKernelRowSlack + 63) / 64 * 64;
  ring_pixels_ = static_cast<int>((ring_stride_ - kKernelRowSlack) / channels);
  ring_rows_ = ring_rows_needed(*ty_);
  ring_.resize(ring_stride_ * ring_rows_);
  if (vertical_first_ && channels == 3 && !tx_->copy &&
      kernels_->horizontal_rgb_rows != nullptr) {
    batch_rows_ = kRowsAtOnce;
  }
  if (vertical_first_) mid_rows_.resize(ring_stride_ * batch_rows_);
  out_stride_ = (static_cast<size_t>(out.width) * channels + kKernelRowSlack + 63) / 64 * 64;
  out_row_.resize(out_stride_ * batch_rows_);
  tap_rows_.resize(ty_->max_count);
  first_tap_from_.resize(out.height);
  int least = ty_->start[out.height - 1];
  for (int y = out.height - 1; y >= 0; --y) {
    least = std::min(least, ty_->start[y]);
    first_tap_from_[y] = least;
  }
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

const uint8_t* Resampler::source_row(int r) const {
  if (r >= band_first_ && r < band_end_) {
    return band_ + static_cast<size_t>(r - band_first_) * band_stride_;
  }
  return &ring_[static_cast<size_t>(r % ring_rows_) * ring_stride_];
}

void Resampler::rows(const uint8_t* hwc, size_t stride, int first_row, int count) {
  const TransformTimer timed;
  CHUTE_CHECK(begun_, kUsage, "Resampler::rows before begin");
  const int region_y = area_.region.y;
  const int lo = std::max(first_row, needed_.y) - region_y;
  const int hi = std::min(first_row + count, needed_.y + needed_.height) - region_y;
  if (lo >= hi) return;
  CHUTE_CHECK(lo == next_source_row_, kData,
              "source row " << lo + region_y << " arrived, expected "
                            << next_source_row_ + region_y);
  // The band's first needed row, at the first needed column.
  const uint8_t* band = hwc + static_cast<size_t>(lo + region_y - first_row) * stride +
                        static_cast<size_t>(needed_.x - column_origin_) * channels_;
  if (!vertical_first_) {
    for (int r = lo; r < hi; ++r) {
      const uint8_t* row = band + static_cast<size_t>(r - lo) * stride;
      ++next_source_row_;
      if (ty_->copy && tx_->copy && !out_.flip) {
        // A pure crop: the source row's slice is the output row.
        write_horizontal(row, available_pixels_, next_output_row_++);
        continue;
      }
      horizontal(row, available_pixels_, ring_slot(r));
      emit_ready_rows();
    }
    return;
  }
  // Vertical first: the output rows this band completes read its rows where
  // they are; the rows a later output row still reads are then copied.
  band_ = band;
  band_stride_ = stride;
  band_first_ = lo;
  band_end_ = hi;
  next_source_row_ = hi;
  emit_ready_rows();
  band_ = nullptr;
  band_first_ = band_end_ = 0;
  if (next_output_row_ < out_.height) {
    const int keep_from = std::max(lo, first_tap_from_[next_output_row_]);
    const size_t bytes = static_cast<size_t>(needed_.width) * channels_;
    for (int r = keep_from; r < hi; ++r) {
      std::memcpy(ring_slot(r), band + static_cast<size_t>(r - lo) * stride, bytes);
    }
  }
}

void Resampler::horizontal(const uint8_t* row, int available, uint8_t* dst) const {
  const HorizontalKernel kernel =
      channels_ == 3 ? kernels_->horizontal_rgb : kernels_->horizontal_gray;
  kernel(row, needed_.x - area_.region.x, available, *tx_, out_.flip, dst);
}

// The horizontal pass of `row` (at the first needed column) into output row y.
void Resampler::write_horizontal(const uint8_t* row, int available, int y) {
  const uint8_t* result = row;
  if (tx_->copy && !out_.flip) {
    result += static_cast<size_t>(tx_->start[0] - (needed_.x - area_.region.x)) * channels_;
  } else {
    horizontal(row, available, out_row_.data());
    result = out_row_.data();
  }
  write_output_row(result, y);
}

// A finished row (out width, interleaved bytes) into the output's format.
void Resampler::write_output_row(const uint8_t* row, int y) const {
  out_.format->write_row(row, channels_, out_.height, out_.width, y, out_.data,
                         out_.simd != SimdLevel::kScalar);
}

void Resampler::emit_ready_rows() {
  const AxisTaps& t = *ty_;
  while (next_output_row_ < out_.height) {
    const int y = next_output_row_;
    if (t.start[y] + t.count[y] > next_source_row_) return;
    if (vertical_first_) {
      emit_row_vertical_first(y);
    } else {
      emit_row_horizontal_first(y);
    }
    ++next_output_row_;
  }
}

void Resampler::emit_row_horizontal_first(int y) {
  const AxisTaps& t = *ty_;
  const int first = t.start[y];
  const uint8_t* result;
  if (t.copy) {
    result = ring_slot(first);
  } else {
    for (int k = 0; k < t.count[y]; ++k) tap_rows_[k] = ring_slot(first + k);
    kernels_->vertical(tap_rows_.data(), &t.weights[static_cast<size_t>(y) * t.stride],
                       t.count[y], t.precision, static_cast<size_t>(out_.width) * channels_,
                       out_row_.data());
    result = out_row_.data();
  }
  write_output_row(result, y);
}

void Resampler::emit_row_vertical_first(int y) {
  const AxisTaps& t = *ty_;
  const int first = t.start[y];
  // Never a copy axis here (see the constructor), unless forced.
  if (t.copy) {
    const bool in_band = first >= band_first_ && first < band_end_;
    write_horizontal(source_row(first), in_band ? available_pixels_ : ring_pixels_, y);
    return;
  }
  for (int k = 0; k < t.count[y]; ++k) tap_rows_[k] = source_row(first + k);
  uint8_t* mid = &mid_rows_[static_cast<size_t>(pending_) * ring_stride_];
  kernels_->vertical(tap_rows_.data(), &t.weights[static_cast<size_t>(y) * t.stride], t.count[y],
                     t.precision, static_cast<size_t>(needed_.width) * channels_, mid);
  ++pending_;
  if (pending_ == batch_rows_ || y == out_.height - 1) write_pending_rows();
}

// The rows waiting in mid_rows_ (output rows next_output_row_ - pending_ + 1
// up to next_output_row_): all at once when there are enough, else one by one.
void Resampler::write_pending_rows() {
  const int first_y = next_output_row_ - pending_ + 1;
  if (pending_ == kRowsAtOnce) {
    const uint8_t* src[kRowsAtOnce];
    uint8_t* dst[kRowsAtOnce];
    for (int r = 0; r < kRowsAtOnce; ++r) {
      src[r] = &mid_rows_[static_cast<size_t>(r) * ring_stride_];
      dst[r] = &out_row_[static_cast<size_t>(r) * out_stride_];
    }
    kernels_->horizontal_rgb_rows(src, needed_.x - area_.region.x, ring_pixels_, *tx_, out_.flip,
                                  dst);
    for (int r = 0; r < kRowsAtOnce; ++r) write_output_row(dst[r], first_y + r);
  } else {
    for (int r = 0; r < pending_; ++r) {
      write_horizontal(&mid_rows_[static_cast<size_t>(r) * ring_stride_], ring_pixels_,
                       first_y + r);
    }
  }
  pending_ = 0;
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

}  // namespace chute

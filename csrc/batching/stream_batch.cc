#include "batching/stream_batch.h"

#include <algorithm>
#include <cstring>

namespace chute {
namespace {

// Samples read in place keep their storage (a mapped shard) alive; once a
// batch is decoded, what lies wholly inside its samples may leave memory,
// so the resident part of a large shard stays about the batches in flight.
// Consecutive samples of one storage (the usual batch) make one range; what
// lies between them in it was skipped, so no other batch needs it either.
void release_in_place(const std::vector<PlannedSample>& samples) {
  const InPlaceStorage* storage = nullptr;
  uint64_t begin = 0;
  uint64_t end = 0;
  for (const PlannedSample& s : samples) {
    const InPlaceStorage* st = s.encoded.in_place.get();
    if (st == nullptr) continue;
    if (st == storage && s.encoded.offset >= end) {
      end = s.encoded.end_offset;
      continue;
    }
    if (storage != nullptr) storage->release(begin, end);
    storage = st;
    begin = s.encoded.offset;
    end = s.encoded.end_offset;
  }
  if (storage != nullptr) storage->release(begin, end);
}

uint64_t encoded_bytes(const std::vector<PlannedSample>& samples) {
  uint64_t bytes = 0;
  for (const PlannedSample& s : samples) bytes += s.encoded.payload_bytes;
  return bytes;
}

}  // namespace

// About 64 KiB of encoded input per piece: a few images, or a few hundred
// tiny samples (a hand-off per tiny row would cost more than the row).
size_t decode_piece_rows(size_t rows, uint64_t encoded_bytes) {
  const auto per_row = static_cast<size_t>(
      std::max<uint64_t>(1, encoded_bytes / std::max<size_t>(1, rows)));
  return std::clamp<size_t>((size_t{64} << 10) / per_row, 1, std::max<size_t>(1, rows));
}

StreamBatchJob::StreamBatchJob(const StreamBatchContext& context, BatchTask task)
    : StreamBatchJob(context, std::move(task), 0) {}

StreamBatchJob::StreamBatchJob(const StreamBatchContext& context, BatchTask task,
                               size_t piece_rows)
    : PieceJob(task.sequence, task.samples.size(),
               piece_rows > 0 ? piece_rows
                              : decode_piece_rows(task.samples.size(), encoded_bytes(task.samples))),
      context_(context),
      task_(std::move(task)),
      failed_(task_.samples.size(), 0),
      unstacked_(context_.decoding->fields.size(), 0) {}

void StreamBatchJob::allocate() {
  prepare();
  const SampleDecoding& decoding = *context_.decoding;
  const std::vector<PlannedSample>& samples = task_.samples;
  const size_t n = samples.size();
  Batch& batch = batch_;
  batch.size = static_cast<int64_t>(n);
  if (decoding.collect_keys) {
    batch.keys.reserve(n);
    for (const PlannedSample& s : samples) batch.keys.push_back(s.encoded.key);
  }
  batch.source_index.reserve(n);
  for (const PlannedSample& s : samples) batch.source_index.push_back(s.encoded.source_index);
  batch.columns.resize(decoding.fields.size());
  row_bytes_.assign(decoding.fields.size(), 0);
  // Rows dropped before decoding (prepare()) take no part in the columns'
  // shapes; finish() removes them.
  auto has = [&](size_t row, size_t fi) {
    return !failed_[row] && samples[row].fields[fi].member >= 0;
  };
  for (size_t fi = 0; fi < decoding.fields.size(); ++fi) {
    const FieldPlan& f = decoding.fields[fi];
    Column& column = batch.columns[fi];
    bool any_absent = false;
    for (size_t i = 0; i < n; ++i) any_absent |= !failed_[i] && !has(i, fi);
    if (any_absent) {
      column.present.resize(n);
      for (size_t i = 0; i < n; ++i) column.present[i] = has(i, fi);
    }
    if (f.decoder == nullptr) {
      column.kind = ColumnKind::kBytes;
      column.raw.resize(n);
      continue;
    }
    column.kind = f.stack && !unstacked_[fi] ? ColumnKind::kStacked : ColumnKind::kList;
    if (column.kind == ColumnKind::kList) {
      column.items.resize(n);
      continue;
    }
    // The first present row fixes the stacked shape (the others were checked
    // to match it); with none, the column holds one zero byte per row.
    ProbedField none;
    const ProbedField* p0 = &none;
    for (size_t i = 0; i < n; ++i) {
      if (has(i, fi)) {
        p0 = &samples[i].fields[fi];
        break;
      }
    }
    std::vector<int64_t> shape = p0->shape;
    shape.insert(shape.begin(), static_cast<int64_t>(n));
    column.stacked = make_tensor(*context_.allocator, p0->dtype, std::move(shape));
    column.stacked.descr = p0->descr;
    row_bytes_[fi] = n == 0 ? 0 : column.stacked.nbytes() / n;
    if (any_absent) std::memset(column.stacked.data(), 0, column.stacked.nbytes());
  }
  if (decoding.keep_other_members) batch.other_members.resize(n);
}

void StreamBatchJob::run(size_t begin, size_t end) {
  const bool raise = context_.decoding->on_error == ErrorPolicy::kRaise;
  size_t stop = begin;  // rows [begin, stop) were read
  for (size_t i = begin; i < end && i < stop_row(); ++i) {
    stop = i + 1;
    if (failed_[i]) continue;
    // Outside the try below: a failed allocation fails the batch, it does
    // not make this sample bad.
    allocate_row(i);
    try {
      decode_row(i);
    } catch (const Error& e) {
      drop_row(i, e);
      if (raise) break;
    }
  }
  check_in_place(begin, stop);
}

void StreamBatchJob::allocate_row(size_t row) {
  const PlannedSample& s = task_.samples[row];
  for (size_t fi = 0; fi < s.fields.size(); ++fi) {
    const ProbedField& p = s.fields[fi];
    Column& column = batch_.columns[fi];
    if (p.member >= 0 && column.kind == ColumnKind::kList) {
      column.items[row] = make_tensor(*context_.allocator, p.dtype, p.shape);
      column.items[row].descr = p.descr;
    }
  }
}

void StreamBatchJob::decode_row(size_t row) {
  const SampleDecoding& decoding = *context_.decoding;
  const PlannedSample& s = task_.samples[row];
  const uint8_t* bytes = s.encoded.bytes();
  Batch& batch = batch_;
  for (size_t fi = 0; fi < decoding.fields.size(); ++fi) {
    const FieldPlan& f = decoding.fields[fi];
    const ProbedField& p = s.fields[fi];
    if (p.member < 0) continue;
    const SampleMember& member = s.encoded.members[static_cast<size_t>(p.member)];
    const uint8_t* data = bytes + member.data_begin;
    Column& column = batch.columns[fi];
    if (f.decoder == nullptr) {
      column.raw[row].assign(reinterpret_cast<const char*>(data), member.data_size);
      continue;
    }
    uint8_t* out = column.kind == ColumnKind::kStacked ? column.stacked.data() + row * row_bytes_[fi]
                                                       : column.items[row].data();
    const RowPosition at = task_.ids.empty()
                               ? RowPosition{decoding.seed, task_.epoch, task_.absolute, row, fi}
                               : RowPosition{decoding.seed, task_.epoch, task_.ids[row], 0, fi};
    context_.fields->with_context(s.encoded, &member, [&] {
      f.decoder->decode(data, member.data_size, p, at, out);
    });
  }
  if (decoding.keep_other_members) {
    for (size_t m = 0; m < s.encoded.members.size(); ++m) {
      bool claimed = false;
      for (const ProbedField& p : s.fields) claimed |= p.member == static_cast<int>(m);
      if (claimed) continue;
      const SampleMember& member = s.encoded.members[m];
      batch.other_members[row].emplace_back(
          member.extension,
          std::string(reinterpret_cast<const char*>(bytes + member.data_begin), member.data_size));
    }
  }
}

void StreamBatchJob::check_in_place(size_t begin, size_t end) {
  // One look at each storage (a system call) for the whole piece.
  const InPlaceStorage* refreshed = nullptr;
  for (size_t i = begin; i < end; ++i) {
    const EncodedSample& s = task_.samples[i].encoded;
    if (!s.in_place || failed_[i]) continue;
    if (s.in_place.get() != refreshed) {
      s.in_place->refresh();
      refreshed = s.in_place.get();
    }
    if (s.in_place->lost(s)) drop_row(i, s.in_place->lost_error(s));
  }
}

void StreamBatchJob::drop_row(size_t row, const Error& error) {
  if (context_.decoding->on_error == ErrorPolicy::kRaise) {
    fail(row, std::make_exception_ptr(error));
    return;
  }
  const EncodedSample& sample = task_.samples[row].encoded;
  context_.skips->record(SkippedSample{error, task_.ids.empty() ? -1 : task_.ids[row],
                                       static_cast<int64_t>(sample.source_index),
                                       static_cast<int64_t>(sample.offset)});
  failed_[row] = 1;
}

void StreamBatchJob::finish() {
  // Rows whose body failed to decode (the header was fine) are dropped; the
  // batch comes out shorter rather than holding a row of zeros.
  batch_.drop_rows(failed_);
  // The encoded samples are no longer needed: their buffers go back to the
  // parse threads, and storage that held only them leaves memory.
  release_in_place(task_.samples);
  for (PlannedSample& s : task_.samples) context_.payload_buffers->give(std::move(s.encoded.data));
  task_.samples.clear();
}

}  // namespace chute

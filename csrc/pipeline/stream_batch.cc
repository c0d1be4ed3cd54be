#include "pipeline/stream_batch.h"

#include <algorithm>
#include <cstring>

namespace chute {
namespace {

// About 64 KiB of encoded input per piece: a few images, or a few hundred
// tiny samples (a hand-off per tiny row would cost more than the row).
size_t piece_rows_for(const std::vector<PlannedSample>& samples) {
  const size_t n = samples.size();
  size_t encoded = 0;
  for (const PlannedSample& s : samples) encoded += s.encoded.payload_bytes;
  const size_t per_row = std::max<size_t>(1, encoded / std::max<size_t>(1, n));
  return std::clamp<size_t>((size_t{64} << 10) / per_row, 1, std::max<size_t>(1, n));
}

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

}  // namespace

StreamBatchJob::StreamBatchJob(const StreamBatchContext& context, BatchTask task)
    : PieceJob(task.sequence, task.samples.size(), piece_rows_for(task.samples)),
      context_(context),
      task_(std::move(task)) {}

void StreamBatchJob::allocate() {
  const StreamPlan& plan = *context_.plan;
  const std::vector<PlannedSample>& samples = task_.samples;
  const size_t n = samples.size();
  Batch& batch = batch_;
  batch.size = static_cast<int64_t>(n);
  failed_.assign(n, 0);
  if (plan.collect_keys) {
    batch.keys.reserve(n);
    for (const PlannedSample& s : samples) batch.keys.push_back(s.encoded.key);
  }
  batch.source_index.reserve(n);
  for (const PlannedSample& s : samples) batch.source_index.push_back(s.encoded.source_index);
  batch.columns.resize(plan.fields.size());
  row_bytes_.assign(plan.fields.size(), 0);
  for (size_t fi = 0; fi < plan.fields.size(); ++fi) {
    const FieldPlan& f = plan.fields[fi];
    Column& column = batch.columns[fi];
    bool any_absent = false;
    for (const PlannedSample& s : samples) any_absent |= s.fields[fi].member < 0;
    if (any_absent) {
      column.present.resize(n);
      for (size_t i = 0; i < n; ++i) column.present[i] = samples[i].fields[fi].member >= 0;
    }
    if (f.decoder == nullptr) {
      column.kind = ColumnKind::kBytes;
      column.raw.resize(n);
      continue;
    }
    column.kind = f.stack ? ColumnKind::kStacked : ColumnKind::kList;
    if (!f.stack) {
      column.items.resize(n);
      continue;
    }
    // The first present row fixes the stacked shape (the assembler checked the rest).
    const PlannedSample* shape_source = &samples.front();
    for (const PlannedSample& s : samples) {
      if (s.fields[fi].member >= 0) {
        shape_source = &s;
        break;
      }
    }
    const ProbedField& p0 = shape_source->fields[fi];
    std::vector<int64_t> shape = p0.shape;
    shape.insert(shape.begin(), static_cast<int64_t>(n));
    column.stacked = make_tensor(*context_.allocator, p0.dtype, std::move(shape));
    column.stacked.descr = p0.descr;
    row_bytes_[fi] = column.stacked.nbytes() / n;
    if (any_absent) std::memset(column.stacked.data(), 0, column.stacked.nbytes());
  }
  if (plan.keep_other_members) batch.other_members.resize(n);
}

void StreamBatchJob::run(size_t begin, size_t end) {
  const bool raise = context_.plan->on_error == ErrorPolicy::kRaise;
  size_t stop = begin;  // rows [begin, stop) were read
  for (size_t i = begin; i < end && i < stop_row(); ++i) {
    stop = i + 1;
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
  const StreamPlan& plan = *context_.plan;
  const PlannedSample& s = task_.samples[row];
  for (size_t fi = 0; fi < plan.fields.size(); ++fi) {
    const ProbedField& p = s.fields[fi];
    Column& column = batch_.columns[fi];
    if (p.member >= 0 && column.kind == ColumnKind::kList) {
      column.items[row] = make_tensor(*context_.allocator, p.dtype, p.shape);
      column.items[row].descr = p.descr;
    }
  }
}

void StreamBatchJob::decode_row(size_t row) {
  const StreamPlan& plan = *context_.plan;
  const PlannedSample& s = task_.samples[row];
  const uint8_t* bytes = s.encoded.bytes();
  Batch& batch = batch_;
  for (size_t fi = 0; fi < plan.fields.size(); ++fi) {
    const FieldPlan& f = plan.fields[fi];
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
    const RowPosition at{plan.seed, plan.epoch, task_.absolute, row, fi};
    context_.fields->with_context(s.encoded, &member, [&] {
      f.decoder->decode(data, member.data_size, p, at, out);
    });
  }
  if (plan.keep_other_members) {
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
  if (context_.plan->on_error == ErrorPolicy::kRaise) {
    fail(row, std::make_exception_ptr(error));
    return;
  }
  context_.skips->record(error);
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

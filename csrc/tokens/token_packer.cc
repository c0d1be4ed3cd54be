#include "tokens/token_packer.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <unordered_map>

#include "core/error.h"
#include "io/mapped_region.h"

namespace chute {

namespace {

// Whether converting Src to Out can change a value (uint32 or int64 ids
// into int32 batches): those conversions check every value.
template <typename Src, typename Out>
constexpr bool kNarrowing =
    sizeof(Src) > sizeof(Out) ||
    (sizeof(Src) == sizeof(Out) && std::is_unsigned<Src>::value && std::is_signed<Out>::value);

// Returns whether every value kept its value.
template <typename Src, typename Out>
bool convert(const uint8_t* bytes, int64_t n, Out* out) {
  // memcpy per element: the source may sit at any alignment (a .npy header
  // of odd length, a Megatron pointer); the compiler turns this into
  // vector loads. What a narrowing loses is OR-ed over the run, which
  // vectorises too: an unsigned id past Out's largest sets the top bit, a
  // wider one that changes leaves bits in v ^ back.
  [[maybe_unused]] Src lost = 0;
  for (int64_t j = 0; j < n; ++j) {
    Src v;
    std::memcpy(&v, bytes + j * static_cast<int64_t>(sizeof(Src)), sizeof(Src));
    out[j] = static_cast<Out>(v);
    if constexpr (kNarrowing<Src, Out> && sizeof(Src) == sizeof(Out)) {
      lost |= v;
    } else if constexpr (kNarrowing<Src, Out>) {
      lost |= v ^ static_cast<Src>(out[j]);
    }
  }
  if constexpr (kNarrowing<Src, Out> && sizeof(Src) == sizeof(Out)) {
    return lost <= static_cast<Src>(std::numeric_limits<Out>::max());
  } else if constexpr (kNarrowing<Src, Out>) {
    return lost == 0;
  }
  return true;
}

template <typename Out>
bool convert_from(DType src, const uint8_t* bytes, int64_t n, Out* out) {
  switch (src) {
    case DType::kU8: return convert<uint8_t>(bytes, n, out);
    case DType::kI8: return convert<int8_t>(bytes, n, out);
    case DType::kU16: return convert<uint16_t>(bytes, n, out);
    case DType::kI16: return convert<int16_t>(bytes, n, out);
    case DType::kU32: return convert<uint32_t>(bytes, n, out);
    case DType::kI32: return convert<int32_t>(bytes, n, out);
    case DType::kI64: return convert<int64_t>(bytes, n, out);
    // Throws nothing: it runs under the SIGBUS guard, and TokenFile::open
    // admits token dtypes only.
    default: return true;
  }
}

// Reads the token at `index` of a span as int64 (for messages and the
// end-of-document scan).
int64_t token_at(DType src, const uint8_t* bytes, int64_t index) {
  int64_t v = 0;
  convert_from<int64_t>(src, bytes + index * static_cast<int64_t>(dtype_size(src)), 1, &v);
  return v;
}

template <typename Src>
void scan_for(const uint8_t* bytes, int64_t n, int64_t eod, std::vector<int64_t>* ends) {
  for (int64_t j = 0; j < n; ++j) {
    Src v;
    std::memcpy(&v, bytes + j * static_cast<int64_t>(sizeof(Src)), sizeof(Src));
    if (static_cast<int64_t>(v) == eod) ends->push_back(j + 1);
  }
}

// Positions just after each `eod` among a span's n tokens.
std::vector<int64_t> document_ends(DType src, const uint8_t* bytes, int64_t n, int64_t eod) {
  std::vector<int64_t> ends;
  switch (src) {
    case DType::kU8: scan_for<uint8_t>(bytes, n, eod, &ends); break;
    case DType::kI8: scan_for<int8_t>(bytes, n, eod, &ends); break;
    case DType::kU16: scan_for<uint16_t>(bytes, n, eod, &ends); break;
    case DType::kI16: scan_for<int16_t>(bytes, n, eod, &ends); break;
    case DType::kU32: scan_for<uint32_t>(bytes, n, eod, &ends); break;
    case DType::kI32: scan_for<int32_t>(bytes, n, eod, &ends); break;
    case DType::kI64: scan_for<int64_t>(bytes, n, eod, &ends); break;
    default: break;
  }
  return ends;
}

}  // namespace

TokenPacker::TokenPacker(std::vector<std::shared_ptr<const TokenFile>> files, PackOptions options)
    : files_(std::move(files)), options_(options) {
  CHUTE_CHECK(options_.seq_len > 0, kUsage, "seq_len must be positive, not " << options_.seq_len);
  const DType out = options_.out_dtype;
  if (out != DType::kI64 && out != DType::kI32) {
    CHUTE_CHECK(is_token_dtype(out), kUsage,
                "token batches are int64, int32 or the files' own dtype, not "
                    << dtype_name(out));
    CHUTE_CHECK(options_.mode == PackMode::kWindows, kUsage,
                "token batches in the files' own dtype (" << dtype_name(out)
                    << ") are for windows packing: packed documents' labels hold -100");
    for (const auto& file : files_) {
      CHUTE_CHECK(file->dtype() == out, kUsage,
                  "'" << file->path() << "' holds " << dtype_name(file->dtype())
                      << " tokens: batches of " << dtype_name(out)
                      << " are for files of that dtype (int64 and int32 take any)");
    }
  }
  const int64_t S = options_.seq_len;
  if (options_.window_stride == 0) options_.window_stride = S;
  CHUTE_CHECK(options_.window_stride > 0 && options_.window_stride <= S, kUsage,
              "window_stride must be from 1 to seq_len (" << S << "), not "
                                                           << options_.window_stride);
  for (const auto& file : files_) add_file(*file);
  file_starts_.emplace_back(spans_.size(), total_tokens_);
  if (options_.mode == PackMode::kWindows) {
    num_sequences_ =
        total_tokens_ > S ? (total_tokens_ - S - 1) / options_.window_stride + 1 : 0;
  } else {
    pack_documents();
  }
}

void TokenPacker::add_file(const TokenFile& file) {
  const bool by_eod = options_.mode == PackMode::kDocuments && file.document_starts().empty();
  CHUTE_CHECK(!by_eod || options_.eod_id >= 0, kUsage,
              "'" << file.path() << "': packing documents needs eod_id, the token that ends "
                     "each document (or a Megatron .idx beside the .bin)");
  const size_t first_span = spans_.size();
  file_starts_.emplace_back(first_span, total_tokens_);
  const uint64_t item = dtype_size(file.dtype());
  for (const TokenSpan& s : file.sequences()) {
    if (s.tokens == 0) continue;
    Span* last = spans_.size() > first_span ? &spans_.back() : nullptr;
    if (last != nullptr &&
        last->byte_offset + static_cast<uint64_t>(last->tokens) * item == s.byte_offset) {
      last->tokens += s.tokens;  // the next sequence lies right after: one span
    } else {
      spans_.push_back(
          {total_tokens_, s.tokens, file.data() + s.byte_offset, s.byte_offset, &file});
    }
    total_tokens_ += s.tokens;
  }
}

bool TokenPacker::documents_known() const {
  if (options_.mode == PackMode::kDocuments || options_.eod_id >= 0) return true;
  return std::all_of(files_.begin(), files_.end(),
                     [](const auto& f) { return !f->document_starts().empty(); });
}

const std::vector<TokenPacker::Document>& TokenPacker::documents() const {
  std::call_once(documents_found_, [this] {
    if (documents_known()) find_documents(&documents_);
  });
  return documents_;
}

void TokenPacker::find_documents(std::vector<Document>* out) const {
  for (size_t k = 0; k < files_.size(); ++k) {
    const TokenFile& file = *files_[k];
    const auto [first_span, first_token] = file_starts_[k];
    const std::vector<int64_t>& docs = file.document_starts();
    if (docs.empty()) {
      for (size_t i = first_span; i < file_starts_[k + 1].first; ++i) {
        find_documents(spans_[i], out);
      }
      continue;
    }
    // Where each of the file's sequences starts in the stream, then its end.
    std::vector<int64_t> sequence_starts;
    sequence_starts.reserve(file.sequences().size() + 1);
    int64_t at = first_token;
    for (const TokenSpan& s : file.sequences()) {
      sequence_starts.push_back(at);
      at += s.tokens;
    }
    sequence_starts.push_back(at);
    // Every document, those without tokens too: Megatron counts them.
    for (size_t d = 0; d + 1 < docs.size(); ++d) {
      const int64_t start = sequence_starts[static_cast<size_t>(docs[d])];
      const int64_t end = sequence_starts[static_cast<size_t>(docs[d + 1])];
      out->push_back({start, end - start});
    }
  }
}

void TokenPacker::find_documents(const Span& span, std::vector<Document>* out) const {
  int64_t begin = 0;
  for (int64_t end : document_ends(span.file->dtype(), span.data, span.tokens, options_.eod_id)) {
    out->push_back({span.start + begin, end - begin});
    begin = end;
  }
  if (begin < span.tokens) out->push_back({span.start + begin, span.tokens - begin});
}

void TokenPacker::pack_documents() {
  const int64_t S = options_.seq_len;
  int64_t fill = 0;
  sequence_pieces_.push_back(0);
  auto close = [&] {
    if (fill == 0) return;
    pad_tokens_ += S - fill;
    sequence_pieces_.push_back(static_cast<int64_t>(pieces_.size()));
    fill = 0;
  };
  for (const Document& doc : documents()) {
    if (doc.length == 0) continue;  // counted, but nothing to pack
    int64_t offset = 0;
    if (doc.length > S) {
      close();
      for (; doc.length - offset > S; offset += S) {
        pieces_.push_back({doc.start + offset, S, true});
        fill = S;
        close();
      }
    } else if (fill + doc.length > S) {
      close();
    }
    pieces_.push_back({doc.start + offset, doc.length - offset, false});
    fill += doc.length - offset;
  }
  close();
  num_sequences_ = static_cast<int64_t>(sequence_pieces_.size()) - 1;
}

int64_t TokenPacker::unused_tokens() const {
  if (options_.mode != PackMode::kWindows) return 0;
  // The tokens past the last window's input_ids.
  const int64_t covered =
      num_sequences_ > 0 ? (num_sequences_ - 1) * options_.window_stride + options_.seq_len : 0;
  return total_tokens_ - covered;
}

std::vector<int64_t> TokenPacker::document_lengths() const {
  const std::vector<Document>& all = documents();
  std::vector<int64_t> out;
  out.reserve(all.size());
  for (const Document& d : all) out.push_back(d.length);
  return out;
}

void TokenPacker::bad_token(const Span& span, int64_t index, int64_t value) const {
  const uint64_t at =
      span.byte_offset + static_cast<uint64_t>(index) * dtype_size(span.file->dtype());
  CHUTE_CHECK(false, kData,
              "'" << span.file->path() << "': token id " << value << " at byte offset " << at
                  << " is outside the vocabulary (vocab_size " << options_.vocab_size << ")");
}

template <typename Out>
void TokenPacker::copy_runs(const std::vector<Run>& runs) const {
  // Each run cut at the spans it crosses; all of them are read (copied, or
  // converted as they are copied) under one SIGBUS guard.
  struct Segment {
    const Span* span;
    int64_t skip;  // tokens into the span
    int64_t n;
    Out* out;
  };
  struct Reading {
    const Segment* segments;
    size_t count;
    DType out_dtype;
    volatile size_t done;  // read after a fault has left the loop midway
    bool kept;             // every converted value kept its value
  };
  thread_local std::vector<Segment> segments;
  segments.clear();
  for (const Run& run : runs) {
    int64_t start = run.start;
    int64_t n = run.n;
    Out* out = reinterpret_cast<Out*>(run.out);
    auto it = std::upper_bound(spans_.begin(), spans_.end(), start,
                               [](int64_t s, const Span& span) { return s < span.start; });
    CHUTE_CHECK(it != spans_.begin(), kUsage, "token " << start << " is before the stream");
    --it;
    while (n > 0) {
      CHUTE_CHECK(it != spans_.end(), kUsage, "token " << start << " is past the stream");
      const Span& span = *it;
      const int64_t skip = start - span.start;
      const int64_t take = std::min(n, span.tokens - skip);
      segments.push_back({&span, skip, take, out});
      out += take;
      n -= take;
      start += take;
      ++it;
    }
  }
  Reading reading{segments.data(), segments.size(), options_.out_dtype, 0, true};
  const bool whole = read_from_mapping(
      [](void* context) {
        auto* r = static_cast<Reading*>(context);
        for (size_t i = 0; i < r->count; ++i) {
          const Segment& g = r->segments[i];
          const DType src = g.span->file->dtype();
          const uint8_t* from = g.span->data + g.skip * static_cast<int64_t>(dtype_size(src));
          if (src == r->out_dtype) {
            std::memcpy(g.out, from, static_cast<size_t>(g.n) * sizeof(Out));
          } else if (!convert_from(src, from, g.n, g.out)) {
            r->kept = false;
          }
          r->done = i + 1;
        }
      },
      &reading);
  const size_t done = whole ? segments.size() : reading.done;
  // A file cut while mapped faults past its new end, but the rest of the
  // page that end falls in reads as zeros: the size now tells them apart,
  // looked at once per file for all the rows read (shuffled windows go back
  // and forth between files).
  thread_local std::unordered_map<const TokenFile*, uint64_t> sizes_now;
  sizes_now.clear();
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& g = segments[i];
    const TokenFile& file = *g.span->file;
    const uint64_t item = dtype_size(file.dtype());
    const uint64_t begin = g.span->byte_offset + static_cast<uint64_t>(g.skip) * item;
    const uint64_t end = begin + static_cast<uint64_t>(g.n) * item;
    auto known = sizes_now.find(&file);
    if (known == sizes_now.end()) known = sizes_now.emplace(&file, file.current_size()).first;
    const uint64_t size_now = known->second;
    CHUTE_CHECK(i != done && end <= size_now, kIo,
                "'" << file.path() << "': tokens at byte offset " << begin << " to " << end
                    << " are gone: the file was cut to " << size_now
                    << " bytes after it was opened");
  }
  const auto vocab = static_cast<uint64_t>(options_.vocab_size);
  for (const Segment& g : segments) {
    if (vocab == 0) break;
    bool bad = false;
    for (int64_t j = 0; j < g.n; ++j) bad |= static_cast<uint64_t>(g.out[j]) >= vocab;
    if (!bad) continue;
    // The file's value for the message (a converted one may have wrapped).
    const DType src = g.span->file->dtype();
    const size_t item = dtype_size(src);
    for (int64_t j = 0; j < g.n; ++j) {
      uint8_t raw[sizeof(int64_t)] = {};
      const CopySpan one{raw, g.span->data + static_cast<size_t>(g.skip + j) * item, item};
      const int64_t v = copy_from_mapping(&one, 1) == 1 ? token_at(src, raw, 0)
                                                         : static_cast<int64_t>(g.out[j]);
      if (static_cast<uint64_t>(v) >= vocab) bad_token(*g.span, g.skip + j, v);
    }
  }
  // An id the batches' dtype cannot hold (one past vocab_size was refused above).
  if (!reading.kept) {
    for (const Segment& g : segments) {
      const DType src = g.span->file->dtype();
      const size_t item = dtype_size(src);
      for (int64_t j = 0; j < g.n; ++j) {
        uint8_t raw[sizeof(int64_t)] = {};
        const CopySpan one{raw, g.span->data + static_cast<size_t>(g.skip + j) * item, item};
        if (copy_from_mapping(&one, 1) != 1) continue;
        const int64_t v = token_at(src, raw, 0);
        CHUTE_CHECK(v == static_cast<int64_t>(g.out[j]), kData,
                    "'" << g.span->file->path() << "': token id " << v << " at byte offset "
                        << g.span->byte_offset + static_cast<uint64_t>(g.skip + j) * item
                        << " does not fit the " << dtype_name(options_.out_dtype)
                        << " batches (out_dtype): take int64 batches, or give vocab_size to "
                           "refuse such ids when the dataset is made");
      }
    }
  }
}

template <typename Out>
void TokenPacker::plan_row(TokenField field, int64_t seq, Out* out, std::vector<Run>* runs) const {
  const int64_t S = options_.seq_len;
  auto take = [runs](int64_t start, int64_t n, Out* to) {
    if (n > 0) runs->push_back({start, n, reinterpret_cast<uint8_t*>(to)});
  };
  if (options_.mode == PackMode::kWindows) {
    const int64_t start = seq * options_.window_stride;
    switch (field) {
      case TokenField::kInputIds: return take(start, S, out);
      case TokenField::kLabels: return take(start + 1, S, out);
      case TokenField::kWindow: return take(start, S + 1, out);
      case TokenField::kPositionIds:
        for (int64_t j = 0; j < S; ++j) out[j] = static_cast<Out>(j);
        return;
    }
  }
  CHUTE_CHECK(field != TokenField::kWindow, kUsage,
              "the window field is for windows packing, not documents");
  int64_t at = 0;
  const auto first = static_cast<size_t>(sequence_pieces_[static_cast<size_t>(seq)]);
  const auto last = static_cast<size_t>(sequence_pieces_[static_cast<size_t>(seq) + 1]);
  for (size_t p = first; p < last; ++p) {
    const Piece& piece = pieces_[p];
    Out* row = out + at;
    switch (field) {
      case TokenField::kInputIds:
        take(piece.start, piece.length, row);
        break;
      case TokenField::kLabels:
        if (piece.continues) {
          take(piece.start + 1, piece.length, row);
        } else {
          take(piece.start + 1, piece.length - 1, row);
          row[piece.length - 1] = static_cast<Out>(kIgnoreLabel);
        }
        break;
      case TokenField::kPositionIds:
      case TokenField::kWindow:  // refused above
        for (int64_t j = 0; j < piece.length; ++j) row[j] = static_cast<Out>(j);
        break;
    }
    at += piece.length;
  }
  const int64_t pad = S - at;
  Out* rest = out + at;
  switch (field) {
    case TokenField::kInputIds:
      std::fill(rest, rest + pad, static_cast<Out>(options_.pad_id));
      break;
    case TokenField::kLabels: std::fill(rest, rest + pad, static_cast<Out>(kIgnoreLabel)); break;
    case TokenField::kPositionIds:
    case TokenField::kWindow:  // refused above
      for (int64_t j = 0; j < pad; ++j) rest[j] = static_cast<Out>(j);
      break;
  }
}

template <typename Out>
void TokenPacker::write_rows_as(TokenField field, const int64_t* seqs, size_t n,
                                uint8_t* out) const {
  thread_local std::vector<Run> runs;
  runs.clear();
  const int64_t row = row_tokens(field);
  Out* rows = reinterpret_cast<Out*>(out);
  for (size_t i = 0; i < n; ++i) {
    plan_row(field, seqs[i], rows + static_cast<int64_t>(i) * row, &runs);
  }
  copy_runs<Out>(runs);
}

int64_t TokenPacker::row_tokens(TokenField field) const {
  return field == TokenField::kWindow ? options_.seq_len + 1 : options_.seq_len;
}

void TokenPacker::write_rows(TokenField field, const int64_t* seqs, size_t n,
                             uint8_t* out) const {
  for (size_t i = 0; i < n; ++i) {
    CHUTE_CHECK(seqs[i] >= 0 && seqs[i] < num_sequences_, kUsage,
                "sequence " << seqs[i] << " is out of range for " << num_sequences_
                            << " sequences");
  }
  switch (options_.out_dtype) {
    case DType::kI64: return write_rows_as<int64_t>(field, seqs, n, out);
    case DType::kI32: return write_rows_as<int32_t>(field, seqs, n, out);
    case DType::kU32: return write_rows_as<uint32_t>(field, seqs, n, out);
    case DType::kU16: return write_rows_as<uint16_t>(field, seqs, n, out);
    case DType::kI16: return write_rows_as<int16_t>(field, seqs, n, out);
    case DType::kU8: return write_rows_as<uint8_t>(field, seqs, n, out);
    case DType::kI8: return write_rows_as<int8_t>(field, seqs, n, out);
    default: CHUTE_CHECK(false, kUsage, "token batches of " << dtype_name(options_.out_dtype));
  }
}

}  // namespace chute

// Sequences of seq_len tokens cut from token files, written straight into a
// batch's rows by the engine's threads (through TokenFieldSource).
//
// The files are read as one stream of tokens: each file's sequences in
// order, the files in the order given.
//
// - Windows (nanoGPT's): sequence i is the stream's tokens
//   [i * stride, i * stride + seq_len + 1) (stride: window_stride, seq_len
//   unless set): input_ids are the first seq_len, labels the last seq_len.
//   Windows cross document and file boundaries; the tail that does not fill
//   a window is left out. With stride 1 every start is a sequence (random
//   window offsets draw among them). The kWindow field is
//   the whole window of seq_len + 1 tokens, read and written once: a batch
//   of them holds input_ids and labels as its [:, :-1] and [:, 1:].
// - Documents: documents (ended by the end-of-document token, which belongs
//   to the document it ends, or Megatron's sequences) are packed in stream
//   order, next-fit: a document that does not fit in what is left of the
//   current sequence starts the next one, and the rest of the current one
//   is padding (input pad_id, label -100). A document longer than seq_len
//   starts a sequence of its own and is cut into pieces of seq_len (the
//   last piece, shorter, is packed like a document). Within a piece
//   labels[j] = tokens[j + 1]; a piece's last label is the document's next
//   token, or -100 where the document ends. position_ids count from 0 in
//   each piece and in the padding, so the positions where they are 0 are
//   the boundaries of variable-length attention (cu_seqlens).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "tokens/token_file.h"

namespace chute {

enum class PackMode { kWindows, kDocuments };
enum class TokenField { kInputIds, kLabels, kPositionIds, kWindow };

struct PackOptions {
  int64_t seq_len = 2048;
  PackMode mode = PackMode::kWindows;
  // Windows: tokens from one window's start to the next, 1 to seq_len; 0: seq_len.
  int64_t window_stride = 0;
  int64_t eod_id = -1;      // documents of raw and .npy files end with it; -1: none
  int64_t pad_id = 0;
  int64_t vocab_size = 0;   // > 0: a token id outside [0, vocab_size) is an error
  // kI64, kI32, or (windows only) the files' own dtype: rows are then the
  // files' bytes, copied as they lie.
  DType out_dtype = DType::kI64;
};

class TokenPacker {
 public:
  static constexpr int64_t kIgnoreLabel = -100;

  TokenPacker(std::vector<std::shared_ptr<const TokenFile>> files, PackOptions options);

  const PackOptions& options() const { return options_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_tokens() const { return total_tokens_; }
  // The stream's documents as the files bound them (a Megatron .idx, or
  // eod_id), counted as Megatron counts them: a document without tokens
  // counts too. Packing windows, they are found at the first call (eod_id:
  // one scan of the files), and 0 / empty when some file has no .idx and
  // no eod_id is given.
  bool documents_known() const;
  int64_t num_documents() const { return static_cast<int64_t>(documents().size()); }
  // Padding slots over all sequences (documents mode), and the stream's
  // tokens that are in no sequence's input_ids (windows: the tail).
  int64_t pad_tokens() const { return pad_tokens_; }
  int64_t unused_tokens() const;
  // Tokens of each document, in stream order (see num_documents()).
  std::vector<int64_t> document_lengths() const;

  // Elements of a row of `field`: seq_len, or seq_len + 1 for kWindow.
  int64_t row_tokens(TokenField field) const;

  // Writes rows `seqs[0..n)` of `field` (row_tokens(field) elements of
  // out_dtype each) one after another to `out`. Thread-safe. The files are
  // read under the SIGBUS guard (io/mapped_region.h): a file cut while
  // mapped raises kIo naming it and the byte offset it no longer reaches,
  // never SIGBUS and never zeros. kData naming the file and byte offset for
  // a token id outside the vocabulary; kUsage for kWindow when packing
  // documents.
  void write_rows(TokenField field, const int64_t* seqs, size_t n, uint8_t* out) const;
  void write(TokenField field, int64_t seq, uint8_t* out) const { write_rows(field, &seq, 1, out); }

 private:
  struct Span {
    int64_t start;  // in the stream
    int64_t tokens;
    const uint8_t* data;
    uint64_t byte_offset;
    const TokenFile* file;
  };
  struct Document {
    int64_t start;
    int64_t length;
  };
  struct Piece {
    int64_t start;
    int64_t length;
    bool continues;  // the document goes on after the piece
  };

  // The stream's tokens [start, start + n) go to out[0..n) (elements of out_dtype).
  struct Run {
    int64_t start;
    int64_t n;
    uint8_t* out;
  };

  void add_file(const TokenFile& file);
  // The documents of every file, in stream order, into `out`.
  void find_documents(std::vector<Document>* out) const;
  void find_documents(const Span& span, std::vector<Document>* out) const;
  const std::vector<Document>& documents() const;
  void pack_documents();
  // Writes what row `seq` holds besides the stream's tokens (positions,
  // padding, ignored labels) and lists the runs of tokens it takes.
  template <typename Out>
  void plan_row(TokenField field, int64_t seq, Out* out, std::vector<Run>* runs) const;
  template <typename Out>
  void write_rows_as(TokenField field, const int64_t* seqs, size_t n, uint8_t* out) const;
  // Copies the runs' tokens out of the mapped files and converts them.
  template <typename Out>
  void copy_runs(const std::vector<Run>& runs) const;
  [[noreturn]] void bad_token(const Span& span, int64_t index, int64_t value) const;

  std::vector<std::shared_ptr<const TokenFile>> files_;
  PackOptions options_;
  std::vector<Span> spans_;
  // Each file's first span and first token in the stream, then the ends.
  std::vector<std::pair<size_t, int64_t>> file_starts_;
  int64_t total_tokens_ = 0;
  // Found at construction (documents mode) or at the first call (windows).
  mutable std::once_flag documents_found_;
  mutable std::vector<Document> documents_;
  std::vector<Piece> pieces_;
  std::vector<int64_t> sequence_pieces_;  // sequence i: pieces [s[i], s[i + 1])
  int64_t num_sequences_ = 0;
  int64_t pad_tokens_ = 0;
};

}  // namespace chute

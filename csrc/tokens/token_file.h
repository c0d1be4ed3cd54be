// Files of token ids, mapped read-only: flat arrays as nanoGPT writes them
// (raw .bin of one integer type, no header), 1-D .npy arrays, and
// Megatron-LM's indexed datasets (a .bin of tokens plus an .idx that lists
// its sequences and documents). Opening checks the layout and throws kData
// naming the file and the byte offset of what does not fit.
//
// Megatron's .idx (little-endian): the 9 bytes "MMIDIDX\0\0", a u64 version
// (1), a u8 dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
// 6 float64, 7 float32, 8 uint16), a u64 sequence count S, a u64 document
// count D, then S int32 sequence lengths (tokens), S int64 sequence byte
// offsets into the .bin, and D int64 document indices: sequence numbers
// where documents start, from 0 and ending with S. Megatron's multimodal
// datasets append one int8 mode per sequence after the document indices;
// such an index is read too, its modes kept (sequence_modes()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/unique_fd.h"

namespace chute {

class MappedRegion;

enum class TokenFormat { kRaw, kNpy, kMegatron };

// A run of tokens lying one after another in a file.
struct TokenSpan {
  uint64_t byte_offset;  // in the (.bin) file
  int64_t tokens;
};

// The integer types token ids may be stored as.
bool is_token_dtype(DType t);

class TokenFile {
 public:
  // Maps `path` (and, for kMegatron, `index_path`) and checks them. `dtype`
  // is the element type of a raw file; .npy and .idx files name their own.
  static std::shared_ptr<const TokenFile> open(const std::string& path, TokenFormat format,
                                               DType dtype, const std::string& index_path = "");
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& index_path() const { return index_path_; }
  TokenFormat format() const { return format_; }
  DType dtype() const { return dtype_; }
  uint64_t size() const { return size_; }
  // Byte 0 of the (.bin) file; null for an empty file.
  const uint8_t* data() const;
  // The file's sequences in order: Megatron's, or one span holding every
  // token of a raw or .npy file.
  const std::vector<TokenSpan>& sequences() const { return sequences_; }
  // Megatron only: sequence numbers where documents start, ending with the
  // sequence count; empty for the other formats.
  const std::vector<int64_t>& document_starts() const { return document_starts_; }
  // Megatron multimodal only: one mode per sequence (Megatron's own
  // meaning: 0 text, 1 image, ...); empty for every other file.
  const std::vector<uint8_t>& sequence_modes() const { return sequence_modes_; }
  int64_t num_tokens() const { return num_tokens_; }
  // The (.bin) file's size now (one fstat of the descriptor it was mapped
  // from); 0 when it cannot be looked at. Below size(), the file was cut
  // while mapped: its bytes past the new end read as zeros or fault.
  uint64_t current_size() const;

 private:
  TokenFile() = default;
  // Maps `path`; returns the descriptor it was mapped from.
  static UniqueFd map(const std::string& path, std::unique_ptr<MappedRegion>* region,
                      uint64_t* size);
  void read_raw();
  void read_npy();
  void read_megatron();

  std::string path_;
  std::string index_path_;
  TokenFormat format_ = TokenFormat::kRaw;
  DType dtype_ = DType::kU16;
  uint64_t size_ = 0;
  UniqueFd bin_fd_;
  std::unique_ptr<MappedRegion> bin_;
  std::vector<TokenSpan> sequences_;
  std::vector<int64_t> document_starts_;
  std::vector<uint8_t> sequence_modes_;
  int64_t num_tokens_ = 0;
};

}  // namespace chute

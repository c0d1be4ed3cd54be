#include "tokens/token_file.h"

#include <sys/stat.h>

#include <cstring>
#include <string>

#include "core/error.h"
#include "decode/npy.h"
#include "io/mapped_region.h"
#include "io/unique_fd.h"

namespace chute {

namespace {

constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <typename T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // the engine runs on little-endian machines only
  return v;
}

bool dtype_from_megatron_code(uint8_t code, DType* out) {
  switch (code) {
    case 1: *out = DType::kU8; return true;
    case 2: *out = DType::kI8; return true;
    case 3: *out = DType::kI16; return true;
    case 4: *out = DType::kI32; return true;
    case 5: *out = DType::kI64; return true;
    case 8: *out = DType::kU16; return true;
    default: return false;  // 6 float64, 7 float32: not token ids
  }
}

}  // namespace

bool is_token_dtype(DType t) {
  switch (t) {
    case DType::kU8:
    case DType::kI8:
    case DType::kU16:
    case DType::kI16:
    case DType::kU32:
    case DType::kI32:
    case DType::kI64:
      return true;
    default:
      return false;
  }
}

TokenFile::~TokenFile() = default;

const uint8_t* TokenFile::data() const { return bin_ ? bin_->data() : nullptr; }

uint64_t TokenFile::current_size() const {
  struct stat st {};
  return ::fstat(bin_fd_.get(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

UniqueFd TokenFile::map(const std::string& path, std::unique_ptr<MappedRegion>* region,
                        uint64_t* size) {
  UniqueFd fd = open_for_mapping(path, size);
  if (*size > 0) {
    *region = std::make_unique<MappedRegion>(fd.get(), 0, static_cast<size_t>(*size), path);
  }
  return fd;
}

std::shared_ptr<const TokenFile> TokenFile::open(const std::string& path, TokenFormat format,
                                                 DType dtype, const std::string& index_path) {
  std::shared_ptr<TokenFile> file(new TokenFile());
  file->path_ = path;
  file->format_ = format;
  file->dtype_ = dtype;
  file->bin_fd_ = map(path, &file->bin_, &file->size_);
  switch (format) {
    case TokenFormat::kRaw: file->read_raw(); break;
    case TokenFormat::kNpy: file->read_npy(); break;
    case TokenFormat::kMegatron:
      file->index_path_ = index_path;
      file->read_megatron();
      break;
  }
  for (const TokenSpan& s : file->sequences_) file->num_tokens_ += s.tokens;
  return file;
}

void TokenFile::read_raw() {
  CHUTE_CHECK(is_token_dtype(dtype_), kUsage,
              "'" << path_ << "': token files hold integers; dtype " << dtype_name(dtype_)
                  << " is not one");
  const uint64_t item = dtype_size(dtype_);
  const uint64_t rest = size_ % item;
  CHUTE_CHECK(rest == 0, kData,
              "'" << path_ << "': " << size_ << " bytes is not a whole number of "
                  << dtype_name(dtype_) << " tokens: " << rest << " bytes left over at byte offset "
                  << size_ - rest);
  sequences_.push_back({0, static_cast<int64_t>(size_ / item)});
}

void TokenFile::read_npy() {
  const NpyHeader h = parse_npy_header(data(), static_cast<size_t>(size_), path_);
  CHUTE_CHECK(h.descr.empty() && is_token_dtype(h.dtype), kData,
              "'" << path_ << "': a token array holds integers, this .npy holds "
                  << (h.descr.empty() ? dtype_name(h.dtype) : h.descr));
  CHUTE_CHECK(!h.byteswap, kData,
              "'" << path_ << "': the tokens are not in this machine's byte order");
  CHUTE_CHECK(h.shape.size() == 1, kData,
              "'" << path_ << "': a token array is 1-D, this .npy has " << h.shape.size()
                  << " dimensions");
  CHUTE_CHECK(h.data_offset % h.itemsize == 0, kData,
              "'" << path_ << "': the tokens start at byte offset " << h.data_offset
                  << ", not a multiple of their size");
  dtype_ = h.dtype;
  sequences_.push_back({h.data_offset, h.shape[0]});
}

void TokenFile::read_megatron() {
  std::unique_ptr<MappedRegion> idx;
  uint64_t idx_size = 0;
  map(index_path_, &idx, &idx_size);  // read here, at open, only
  const std::string& at = index_path_;
  CHUTE_CHECK(idx_size >= kIndexHeaderBytes, kData,
              "'" << at << "': truncated Megatron index: " << idx_size
                  << " bytes, the header alone is " << kIndexHeaderBytes);
  const uint8_t* p = idx->data();
  CHUTE_CHECK(std::memcmp(p, kIndexMagic, sizeof(kIndexMagic)) == 0, kData,
              "'" << at
                  << "': not a Megatron index: bad magic at byte offset 0 (expected MMIDIDX)");
  const auto version = read_le<uint64_t>(p + 9);
  CHUTE_CHECK(version == 1, kData,
              "'" << at << "': Megatron index version " << version
                  << " at byte offset 9; only version 1 is known");
  const uint8_t code = p[17];
  CHUTE_CHECK(dtype_from_megatron_code(code, &dtype_), kData,
              "'" << at << "': dtype code " << int{code}
                  << " at byte offset 17 is not an integer type of Megatron's table");
  const auto sequences = read_le<uint64_t>(p + 18);
  const auto documents = read_le<uint64_t>(p + 26);
  const uint64_t room = idx_size - kIndexHeaderBytes;
  const bool fits = sequences <= room / 12 && documents <= (room - sequences * 12) / 8;
  const uint64_t plain_size = fits ? kIndexHeaderBytes + sequences * 12 + documents * 8 : 0;
  // A multimodal index holds one mode byte per sequence after the document indices.
  const bool multimodal = fits && sequences > 0 && idx_size == plain_size + sequences;
  CHUTE_CHECK(fits && (idx_size == plain_size || multimodal), kData,
              "'" << at << "': " << idx_size << " bytes, but its header (byte offset 18) declares "
                  << sequences << " sequences and " << documents << " document indices"
                  << (fits ? " (" + std::to_string(plain_size) + " bytes, or " +
                                 std::to_string(plain_size + sequences) +
                                 " with a multimodal index's mode byte per sequence)"
                           : std::string()));
  const uint64_t item = dtype_size(dtype_);
  const uint64_t bin_rest = size_ % item;
  CHUTE_CHECK(bin_rest == 0, kData,
              "'" << path_ << "': " << size_ << " bytes is not a whole number of "
                  << dtype_name(dtype_) << " tokens: " << bin_rest
                  << " bytes left over at byte offset " << size_ - bin_rest);
  const uint8_t* lengths = p + kIndexHeaderBytes;
  const uint8_t* pointers = lengths + sequences * 4;
  const uint8_t* docs = pointers + sequences * 8;
  sequences_.reserve(static_cast<size_t>(sequences));
  for (uint64_t i = 0; i < sequences; ++i) {
    const auto length = read_le<int32_t>(lengths + i * 4);
    const auto pointer = read_le<int64_t>(pointers + i * 8);
    const uint64_t length_at = kIndexHeaderBytes + i * 4;
    const uint64_t pointer_at = kIndexHeaderBytes + sequences * 4 + i * 8;
    CHUTE_CHECK(length >= 0, kData,
                "'" << at << "': sequence " << i << " has length " << length
                    << " (byte offset " << length_at << ")");
    CHUTE_CHECK(pointer >= 0 && static_cast<uint64_t>(pointer) % item == 0, kData,
                "'" << at << "': sequence " << i << " starts at byte " << pointer
                    << " of the .bin (byte offset " << pointer_at << "), not at a token");
    const uint64_t end = static_cast<uint64_t>(pointer) + static_cast<uint64_t>(length) * item;
    CHUTE_CHECK(end <= size_, kData,
                "'" << at << "': sequence " << i << " (byte offset " << pointer_at
                    << ") ends at byte " << end << " of '" << path_ << "', which has "
                    << size_ << " bytes");
    sequences_.push_back({static_cast<uint64_t>(pointer), length});
  }
  document_starts_.reserve(static_cast<size_t>(documents));
  for (uint64_t d = 0; d < documents; ++d) {
    const auto start = read_le<int64_t>(docs + d * 8);
    const int64_t previous = d == 0 ? 0 : document_starts_.back();
    const uint64_t start_at = kIndexHeaderBytes + sequences * 12 + d * 8;
    CHUTE_CHECK((d > 0 || start == 0) && start >= previous &&
                    start <= static_cast<int64_t>(sequences),
                kData,
                "'" << at << "': document index " << d << " is " << start
                    << " (byte offset " << start_at << "); they rise from 0 to the "
                    << sequences << " sequences");
    document_starts_.push_back(start);
  }
  if (multimodal) {
    const uint8_t* modes = docs + documents * 8;
    sequence_modes_.assign(modes, modes + sequences);
  }
  CHUTE_CHECK(documents > 0 && document_starts_.back() == static_cast<int64_t>(sequences), kData,
              "'" << at << "': the document indices end at "
                  << (documents > 0 ? document_starts_.back() : 0) << ", not at the "
                  << sequences << " sequences (byte offset "
                  << kIndexHeaderBytes + sequences * 12 << ")");
}

}  // namespace chute

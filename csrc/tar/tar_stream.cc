#include "tar/tar_stream.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/error.h"
#include "io/mapped_region.h"

namespace chute {
namespace {

constexpr size_t kBlock = 512;
// L/K/x/g payloads are held in memory whole; real ones are a few hundred bytes.
constexpr uint64_t kMaxExtensionBytes = uint64_t{16} << 20;
// Payload memory is committed at most this far ahead of the bytes that arrived.
constexpr uint64_t kGrowStep = uint64_t{64} << 20;
// After the end-of-archive block we read on (for a pipe's exit status and to
// complete a cache entry) but not forever: a pipe could stream garbage endlessly.
constexpr uint64_t kMaxTrailer = uint64_t{16} << 20;

// Header field offsets (POSIX ustar; GNU shares the first 345 bytes).
constexpr size_t kName = 0, kNameLen = 100;
constexpr size_t kSize = 124, kSizeLen = 12;
constexpr size_t kChksum = 148, kChksumLen = 8;
constexpr size_t kType = 156;
constexpr size_t kMagic = 257;
constexpr size_t kPrefix = 345, kPrefixLen = 155;

uint64_t padding(uint64_t n) { return (kBlock - n % kBlock) % kBlock; }

size_t field_len(const uint8_t* f, size_t len) {
  return static_cast<size_t>(std::find(f, f + len, uint8_t{0}) - f);
}

bool is_space(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// A numeric field as tar writes it: NUL/space-padded octal, or GNU base-256
// (first byte 0x80 positive, 0xff negative, which no size can be).
bool parse_number(const uint8_t* f, size_t len, uint64_t& out) {
  if (f[0] == 0x80) {
    uint64_t v = 0;
    for (size_t i = 1; i < len; ++i) {
      if (v >> 55) return false;
      v = (v << 8) | f[i];
    }
    out = v;
    return true;
  }
  if (f[0] == 0xff) return false;
  size_t end = field_len(f, len);
  size_t begin = 0;
  while (begin < end && is_space(f[begin])) ++begin;
  while (end > begin && is_space(f[end - 1])) --end;
  uint64_t v = 0;
  for (size_t i = begin; i < end; ++i) {
    if (f[i] < '0' || f[i] > '7' || (v >> 60)) return false;
    v = v * 8 + (f[i] - '0');
  }
  out = v;
  return true;
}

// Sum of the 512 header bytes as unsigned chars. It is zero exactly for the
// all-zero end-of-archive block, so one pass serves both tests. This runs for
// every header of every member, hence the explicit SAD on x86.
uint32_t byte_sum(const uint8_t* h) {
#if defined(__SSE2__)
  __m128i acc = _mm_setzero_si128();
  const __m128i zero = _mm_setzero_si128();
  for (size_t i = 0; i < kBlock; i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    acc = _mm_add_epi64(acc, _mm_sad_epu8(v, zero));
  }
  return static_cast<uint32_t>(_mm_cvtsi128_si32(acc) + _mm_extract_epi16(acc, 4));
#else
  uint32_t sum = 0;
  for (size_t i = 0; i < kBlock; ++i) sum += h[i];
  return sum;
#endif
}

// Like tar, accept the unsigned sum and the signed sum some old tars wrote;
// the checksum field itself counts as eight spaces.
bool checksum_ok(const uint8_t* h, uint32_t total) {
  uint64_t stored;
  if (!parse_number(h + kChksum, kChksumLen, stored)) return false;
  uint32_t sum = total;
  for (size_t i = kChksum; i < kChksum + kChksumLen; ++i) sum -= h[i];
  sum += 8 * ' ';
  if (sum == stored) return true;
  int32_t ssum = 0;
  for (size_t i = 0; i < kBlock; ++i) ssum += static_cast<int8_t>(h[i]);
  for (size_t i = kChksum; i < kChksum + kChksumLen; ++i) ssum -= static_cast<int8_t>(h[i]);
  ssum += 8 * ' ';
  return ssum >= 0 && static_cast<uint64_t>(ssum) == stored;
}

bool parse_decimal(const std::string& s, uint64_t& out) {
  if (s.empty() || s.size() > 19) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  out = v;
  return true;
}

// PAX fields that matter here; the rest (mtime, uid, comments) is ignored.
struct PaxOverrides {
  bool has_path = false;
  std::string path;
  bool has_size = false;
  uint64_t size = 0;
  // GNU sparse files: GNU.sparse.size (0.0, 0.1) or GNU.sparse.realsize (1.0)
  // is the expanded size; the map is GNU.sparse.map (0.1), or repeated
  // GNU.sparse.offset/numbytes records (0.0), or lies at the start of the
  // payload (1.0, GNU.sparse.major=1 and minor=0).
  bool has_sparse_size = false;
  uint64_t sparse_size = 0;
  bool has_map = false;
  std::string map;
  std::vector<uint64_t> offsets, numbytes;
  std::string major, minor;
  std::string sparse_fault;  // a sparse value that does not parse
  void clear() {
    has_path = false;
    has_size = false;
    has_sparse_size = false;
    has_map = false;
    offsets.clear();
    numbytes.clear();
    major.clear();
    minor.clear();
    sparse_fault.clear();
  }
  bool sparse_v1() const { return major == "1" && minor == "0"; }
  bool sparse() const { return has_map || !offsets.empty() || !numbytes.empty() || sparse_v1(); }
};

// A sparse file may expand to this much at most: its holes cost memory that
// no byte of the archive pays for.
constexpr uint64_t kMaxSparseSize = uint64_t{4} << 30;

// Old GNU sparse headers: four (offset, numbytes) pairs in the header, a flag
// saying whether extension blocks of 21 more follow, and the expanded size.
constexpr size_t kGnuSparse = 386, kGnuIsExtended = 482, kGnuRealSize = 483;
constexpr size_t kGnuExtEntries = 21, kGnuExtIsExtended = 504;

// A GNU.sparse.* record. Its value only concerns the member's payload, so
// one that does not parse makes that member a fault, not the archive.
void parse_sparse_record(PaxOverrides& into, std::string_view key, const std::string& value) {
  auto number = [&](uint64_t& out) {
    if (!parse_decimal(value, out) && into.sparse_fault.empty()) {
      into.sparse_fault = "bad GNU.sparse." + std::string(key) + " value '" + value + "'";
    }
  };
  if (key == "name") {
    into.has_path = true;
    into.path = value;
  } else if (key == "size" || key == "realsize") {
    into.has_sparse_size = true;
    number(into.sparse_size);
  } else if (key == "map") {
    into.has_map = true;
    into.map = value;
  } else if (key == "offset") {
    number(into.offsets.emplace_back());
  } else if (key == "numbytes") {
    number(into.numbytes.emplace_back());
  } else if (key == "major") {
    into.major = value;
  } else if (key == "minor") {
    into.minor = value;
  }
}

// "%d %s=%s\n" records; a malformed one is an error rather than, as in
// tarfile, a silent end of the archive.
void parse_pax_records(std::string_view r, PaxOverrides& into, const std::string& url,
                       uint64_t header_offset) {
  size_t p = 0;
  while (p < r.size() && r[p] != '\0') {
    size_t q = p;
    uint64_t len = 0;
    while (q < r.size() && q - p < 20 && r[q] >= '0' && r[q] <= '9') {
      len = len * 10 + static_cast<uint64_t>(r[q] - '0');
      ++q;
    }
    const bool framed = q > p && q < r.size() && r[q] == ' ' && len >= 5 &&
                        len <= r.size() - p && r[p + len - 1] == '\n';
    CHUTE_CHECK(framed, kData, "tar archive '" << url << "': malformed PAX record in the header at offset "
                                               << header_offset << " (record at byte " << p << ")");
    const size_t kv = q + 1, kv_end = p + static_cast<size_t>(len) - 1;
    const size_t eq = r.find('=', kv);
    CHUTE_CHECK(eq != std::string::npos && eq < kv_end && eq > kv, kData,
                "tar archive '" << url << "': malformed PAX record in the header at offset "
                                << header_offset << " (record at byte " << p << ")");
    const std::string_view key(r.data() + kv, eq - kv);
    if (key == "path") {
      into.has_path = true;
      into.path.assign(r.data() + eq + 1, kv_end - eq - 1);
      // tarfile strips trailing slashes from a PAX path.
      while (!into.path.empty() && into.path.back() == '/') into.path.pop_back();
    } else if (key == "size") {
      const std::string value(r.substr(eq + 1, kv_end - eq - 1));
      CHUTE_CHECK(parse_decimal(value, into.size), kData,
                  "tar archive '" << url << "': bad PAX size '" << value
                                  << "' in the header at offset " << header_offset);
      into.has_size = true;
    } else if (key.substr(0, 11) == "GNU.sparse.") {
      parse_sparse_record(into, key.substr(11), std::string(r.substr(eq + 1, kv_end - eq - 1)));
    }
    p += static_cast<size_t>(len);
  }
}

// The name and size of the member whose header is `h`: a PAX path or size
// (`local` records before `global` ones) wins, then a GNU long name, then
// the header's own prefix and name fields. `size` holds the header's field.
void resolve_member(const uint8_t* h, const PaxOverrides& local, const PaxOverrides& global,
                    const std::string* long_name, std::string& name, uint64_t& size) {
  if (local.has_path) {
    name = local.path;
  } else if (global.has_path) {
    name = global.path;
  } else if (long_name != nullptr) {
    name = *long_name;
  } else {
    // The prefix field only exists in POSIX ustar headers; old GNU headers
    // keep access times and sparse data in those bytes.
    const bool gnu_magic = std::memcmp(h + kMagic, "ustar  \0", 8) == 0;
    const size_t prefix_len = gnu_magic ? 0 : field_len(h + kPrefix, kPrefixLen);
    name.clear();
    if (prefix_len > 0) {
      name.append(reinterpret_cast<const char*>(h + kPrefix), prefix_len);
      name.push_back('/');
    }
    name.append(reinterpret_cast<const char*>(h + kName), field_len(h + kName, kNameLen));
  }
  if (local.has_size) {
    size = local.size;
  } else if (global.has_size) {
    size = global.size;
  }
}

}  // namespace

struct TarStream::Impl {
  std::unique_ptr<ByteSource> src;
  std::vector<uint8_t> buf;  // what read() filled, unless the file is mapped
  // The bytes being parsed: buf, or the whole mapped file.
  std::shared_ptr<MappedFile> mapping;
  const uint8_t* win = nullptr;
  size_t cap = 0;
  size_t pos = 0;  // next unread byte in win
  size_t end = 0;  // end of valid bytes in win
  uint64_t base = 0;  // stream offset of win[0]
  bool eof = false;
  bool done = false;
  // next() is past the current member's data and padding and has read no
  // block of the next member's headers: an error now is at a member's first
  // header, where Python's tarfile ends an archive quietly.
  bool at_member_start = false;

  TarMember cur;
  bool have_cur = false;
  bool payload_read = false;

  PaxOverrides global;  // `g` records apply to every later member (POSIX)
  PaxOverrides local;   // `x` records apply to the next member
  bool has_long_name = false;
  std::string long_name;
  std::string record;  // payload of the extension header being read
  std::vector<uint8_t> record_bytes;

  const std::string& url() const { return src->url(); }
  uint64_t offset() const { return base + pos; }
  size_t avail() const { return end - pos; }

  void compact() {
    if (pos == 0 || mapping) return;
    std::memmove(buf.data(), buf.data() + pos, end - pos);
    base += pos;
    end -= pos;
    pos = 0;
  }

  // Drops the consumed bytes (all of them when nothing is left unread).
  void reset_if_empty() {
    if (pos == end) {
      base += end;
      pos = end = 0;
    }
  }

  // One large read into the free tail of the buffer; false at EOF.
  bool read_more() {
    if (eof) return false;
    reset_if_empty();
    if (buf.size() - end < buf.size() / 2) compact();
    const size_t got = src->read(buf.data() + end, buf.size() - end);
    if (got == 0) {
      eof = true;
      return false;
    }
    end += got;
    return true;
  }

  bool fill(size_t need) {
    if (avail() >= need) return true;
    if (pos + need > cap) compact();
    while (avail() < need) {
      if (!read_more()) return false;
    }
    return true;
  }

  [[noreturn]] void truncated(const std::string& name, uint64_t header_offset, uint64_t declared,
                              const char* what) {
    CHUTE_CHECK(false, kData, "truncated tar archive '" << url() << "': the stream ends at offset "
                                                        << offset() << " inside the " << what
                                                        << " of member '" << name
                                                        << "' (header at offset " << header_offset
                                                        << ", " << declared << " bytes declared)");
    std::abort();  // not reached
  }

  void skip(uint64_t n, const std::string& name, uint64_t header_offset, uint64_t declared,
            const char* what) {
    while (n > 0) {
      if (avail() == 0 && !read_more()) truncated(name, header_offset, declared, what);
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, avail()));
      pos += k;
      n -= k;
    }
  }

  void copy_out(std::vector<uint8_t>& dst, uint64_t n, const std::string& name,
                uint64_t header_offset, uint64_t declared, const char* what) {
    // Small remainders go through the buffer; large ones are read straight
    // into dst, growing it no faster than the bytes arrive.
    while (n > 0) {
      if (avail() == 0 && n >= cap / 2) {
        reset_if_empty();
        while (n > 0) {
          const size_t step = static_cast<size_t>(std::min(n, kGrowStep));
          const size_t old = dst.size();
          dst.resize(old + step);
          size_t got = 0;
          while (got < step) {
            const size_t r = eof ? 0 : src->read(dst.data() + old + got, step - got);
            if (r == 0) {
              eof = true;
              dst.resize(old + got);
              truncated(name, header_offset, declared, what);
            }
            got += r;
            base += r;
          }
          n -= step;
        }
        return;
      }
      if (avail() == 0 && !read_more()) truncated(name, header_offset, declared, what);
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, avail()));
      dst.insert(dst.end(), win + pos, win + pos + k);
      pos += k;
      n -= k;
    }
  }

  void drain() {
    uint64_t left = kMaxTrailer;
    pos = end;
    reset_if_empty();
    while (!eof && left > 0) {
      const size_t r =
          src->read(buf.data(), static_cast<size_t>(std::min<uint64_t>(left, buf.size())));
      if (r == 0) eof = true;
      base += r;
      left -= std::min<uint64_t>(left, r);
    }
  }

  // Reads an extension header's payload (plus padding) into `record`.
  void read_record(uint64_t size, uint64_t header_offset, char type) {
    CHUTE_CHECK(size <= kMaxExtensionBytes, kData,
                "tar archive '" << url() << "': the '" << type << "' extension header at offset "
                                << header_offset << " declares " << size
                                << " bytes; refusing more than " << kMaxExtensionBytes);
    const uint64_t padded = size + padding(size);
    if (fill(static_cast<size_t>(std::min<uint64_t>(padded, cap)))) {
      if (padded <= avail()) {  // the common case: no copy beyond the record itself
        record.assign(reinterpret_cast<const char*>(win + pos), static_cast<size_t>(size));
        pos += static_cast<size_t>(padded);
        return;
      }
    }
    const std::string label = std::string("<tar '") + type + "' record>";
    record_bytes.clear();
    copy_out(record_bytes, size, label, header_offset, size, "data");
    skip(padding(size), label, header_offset, size, "padding");
    record.assign(reinterpret_cast<const char*>(record_bytes.data()), record_bytes.size());
  }

  void parse_pax(PaxOverrides& into, uint64_t header_offset) {
    parse_pax_records(record, into, url(), header_offset);
  }

  // Raw (offset, numbytes) pairs of a sparse map, as tarfile collects them.
  using SparseMap = std::vector<std::pair<uint64_t, uint64_t>>;

  void fault(std::string why) {
    if (cur.fault.empty()) cur.fault = std::move(why);
  }

  // The old GNU `S` header at pos: its map entries, then as many extension
  // blocks as it announces. tarfile keeps the header's entries until one
  // does not parse, and the extension blocks' non-empty ones.
  void read_old_gnu_sparse() {
    const uint8_t* h = win + pos;
    SparseMap map;
    for (size_t i = 0; i < 4; ++i) {
      uint64_t offset, numbytes;
      if (!parse_number(h + kGnuSparse + 24 * i, 12, offset) ||
          !parse_number(h + kGnuSparse + 24 * i + 12, 12, numbytes)) {
        break;
      }
      map.emplace_back(offset, numbytes);
    }
    bool extended = h[kGnuIsExtended] != 0;
    uint64_t real_size = 0;
    const bool real_ok = parse_number(h + kGnuRealSize, 12, real_size);
    pos += kBlock;
    while (extended) {
      if (!fill(kBlock)) {
        pos = end;
        truncated(cur.name, cur.header_offset, cur.stored_size, "sparse map");
      }
      const uint8_t* e = win + pos;
      for (size_t i = 0; i < kGnuExtEntries; ++i) {
        uint64_t offset, numbytes;
        if (!parse_number(e + 24 * i, 12, offset) || !parse_number(e + 24 * i + 12, 12, numbytes)) {
          break;
        }
        if (offset != 0 && numbytes != 0) map.emplace_back(offset, numbytes);
      }
      extended = e[kGnuExtIsExtended] != 0;
      pos += kBlock;
    }
    if (!real_ok) fault("bad expanded size in its GNU sparse header");
    set_sparse(map, real_size);
  }

  // PAX sparse formats: the map from the records (0.0, 0.1) or from the
  // start of the payload (1.0: a count and pairs of decimal numbers, one per
  // line, padded to whole blocks that the stored size includes).
  void read_pax_sparse() {
    if (!local.sparse_fault.empty()) fault(local.sparse_fault);
    if (!local.has_sparse_size) fault("GNU sparse member without an expanded size");
    SparseMap map;
    if (local.has_map) {
      std::vector<uint64_t> numbers;
      size_t p = 0;
      while (p <= local.map.size()) {
        const size_t comma = std::min(local.map.find(',', p), local.map.size());
        uint64_t v = 0;
        if (!parse_decimal(local.map.substr(p, comma - p), v)) {
          fault("bad GNU.sparse.map '" + local.map.substr(0, 100) + "'");
          break;
        }
        numbers.push_back(v);
        p = comma + 1;
      }
      for (size_t i = 0; i + 1 < numbers.size(); i += 2) map.emplace_back(numbers[i], numbers[i + 1]);
    } else if (!local.sparse_v1()) {
      if (local.offsets.size() != local.numbytes.size()) {
        fault("GNU.sparse.offset and GNU.sparse.numbytes records do not pair up");
      }
      for (size_t i = 0; i < std::min(local.offsets.size(), local.numbytes.size()); ++i) {
        map.emplace_back(local.offsets[i], local.numbytes[i]);
      }
    } else if (cur.fault.empty()) {
      read_sparse_map_v1(map);
    }
    set_sparse(map, local.sparse_size);
  }

  void read_sparse_map_v1(SparseMap& map) {
    std::string text;
    std::vector<uint64_t> numbers;
    uint64_t count = 0;
    bool have_count = false;
    size_t line = 0;  // start of the next unparsed line in text
    for (;;) {
      const size_t nl = text.find('\n', line);
      if (nl == std::string::npos) {
        if (cur.stored_size < kBlock || text.size() >= kMaxExtensionBytes) {
          fault("its GNU sparse map (format 1.0) runs past its data");
          return;
        }
        if (!fill(kBlock)) {
          pos = end;
          truncated(cur.name, cur.header_offset, cur.stored_size, "sparse map");
        }
        text.append(reinterpret_cast<const char*>(win + pos), kBlock);
        pos += kBlock;
        cur.stored_size -= kBlock;
        continue;
      }
      uint64_t v = 0;
      if (!parse_decimal(text.substr(line, nl - line), v)) {
        fault("bad number in its GNU sparse map (format 1.0)");
        return;
      }
      line = nl + 1;
      if (!have_count) {
        have_count = true;
        count = v;
        if (count > kMaxExtensionBytes) {
          fault("its GNU sparse map (format 1.0) declares " + std::to_string(count) + " regions");
          return;
        }
      } else {
        numbers.push_back(v);
      }
      if (have_count && numbers.size() == 2 * count) break;
    }
    for (size_t i = 0; i + 1 < numbers.size(); i += 2) map.emplace_back(numbers[i], numbers[i + 1]);
  }

  // Checks `map` against the expanded size and the stored bytes: regions in
  // order, inside the file, their bytes all stored. tarfile reads a map that
  // breaks these as garbage; here the member is a fault.
  void set_sparse(const SparseMap& map, uint64_t real_size) {
    cur.sparse = true;
    cur.size = real_size;
    uint64_t end_of_last = 0, stored = 0;
    for (const auto& [offset, length] : map) {
      if (length == 0) continue;
      if (offset < end_of_last || offset > real_size || length > real_size - offset) {
        fault("its GNU sparse map has a region (offset " + std::to_string(offset) + ", " +
              std::to_string(length) + " bytes) out of order or past the file's " +
              std::to_string(real_size) + " bytes");
        return;
      }
      cur.extents.push_back({offset, length});
      end_of_last = offset + length;
      stored += length;
    }
    if (stored > cur.stored_size) {
      fault("its GNU sparse map covers " + std::to_string(stored) + " bytes but " +
            std::to_string(cur.stored_size) + " are stored");
    } else if (real_size > kMaxSparseSize) {
      fault("it is a GNU sparse file of " + std::to_string(real_size) +
            " bytes; refusing to expand more than " + std::to_string(kMaxSparseSize));
    }
  }

  // Appends the current sparse member's file to dst: its stored regions
  // with zeros between them.
  void expand_sparse(std::vector<uint8_t>& dst) {
    uint64_t at = 0, used = 0;
    for (const SparseExtent& e : cur.extents) {
      dst.resize(dst.size() + static_cast<size_t>(e.offset - at), 0);
      copy_out(dst, e.length, cur.name, cur.header_offset, cur.stored_size, "data");
      at = e.offset + e.length;
      used += e.length;
    }
    dst.resize(dst.size() + static_cast<size_t>(cur.size - at), 0);
    skip(cur.stored_size - used, cur.name, cur.header_offset, cur.stored_size, "data");
  }

  bool next_member() {
    if (done) return false;
    at_member_start = false;
    if (have_cur) {
      // What is left of its data, or only its padding once the payload was
      // read: a cut in the padding then fails here, the payload being whole
      // (tarfile reads such a member, and notices the cut only after it).
      if (!payload_read) {
        skip(cur.stored_size + padding(cur.stored_size), cur.name, cur.header_offset, cur.stored_size,
             "data");
      } else {
        skip(padding(cur.stored_size), cur.name, cur.header_offset, cur.stored_size, "padding");
      }
      have_cur = false;
    }
    at_member_start = true;
    bool in_chain = false;  // extension headers seen that still await their member
    uint64_t first = 0;
    local.clear();
    has_long_name = false;
    if (mapping) src->will_read(offset());
    for (;;) {
      const uint64_t off = offset();
      if (!fill(kBlock)) {
        CHUTE_CHECK(avail() != 0 || off != 0, kData,
                    "'" << url() << "' is empty (0 bytes at offset 0): not a tar archive");
        CHUTE_CHECK(avail() != 0 || !in_chain, kData,
                    "truncated tar archive '" << url() << "': the stream ends at offset " << off
                                              << " after the extension header at offset " << first
                                              << ", before its member's header");
        CHUTE_CHECK(avail() == 0, kData,
                    "truncated tar archive '" << url() << "': the stream ends inside the header at offset "
                                              << off << " (" << avail() << " of 512 bytes)");
        // EOF on a block boundary without the end-of-archive blocks: tar and
        // tarfile accept it as the end, and so do we.
        done = true;
        src->mark_complete();
        return false;
      }
      const uint8_t* h = win + pos;
      const uint32_t total = byte_sum(h);
      if (total == 0) {
        CHUTE_CHECK(!in_chain, kData,
                    "tar archive '" << url() << "': end-of-archive block at offset " << off
                                    << " right after the extension header at offset " << first);
        pos += kBlock;
        drain();
        done = true;
        if (eof) src->mark_complete();
        return false;
      }
      CHUTE_CHECK(checksum_ok(h, total), kData,
                  "bad header checksum in tar archive '" << url() << "' at offset " << off
                                                         << (off == 0 ? " (not a tar archive?)" : ""));
      if (!in_chain) first = off;
      const char type = static_cast<char>(h[kType]);
      uint64_t size;
      CHUTE_CHECK(parse_number(h + kSize, kSizeLen, size), kData,
                  "tar archive '" << url() << "': bad size field in the header at offset " << off);
      if (type == 'L' || type == 'K' || type == 'x' || type == 'X' || type == 'g') {
        in_chain = type != 'g' || in_chain;
        at_member_start = false;
        pos += kBlock;
        read_record(size, off, type);
        if (type == 'L') {
          has_long_name = true;
          long_name.assign(record.c_str());  // up to the first NUL, as tar reads it
        } else if (type == 'x' || type == 'X') {
          parse_pax(local, off);
        } else if (type == 'g') {
          parse_pax(global, off);
        }
        continue;
      }

      const size_t raw_len = field_len(h + kName, kNameLen);
      const bool raw_dir_slash = raw_len > 0 && h[kName + raw_len - 1] == '/';
      std::string& name = cur.name;
      resolve_member(h, local, global, has_long_name ? &long_name : nullptr, name, size);
      const bool regular =
          type == '0' || type == '7' || type == 'S' || (type == '\0' && !raw_dir_slash);
      if (regular) {
        cur.header_offset = first;
        cur.size = size;
        cur.stored_size = size;
        cur.sparse = false;
        cur.extents.clear();
        cur.fault.clear();
        if (type == 'S') {
          read_old_gnu_sparse();  // moves past the header and its extension blocks
        } else {
          pos += kBlock;
          if (local.sparse()) read_pax_sparse();
        }
        cur.data_offset = offset();
        have_cur = true;
        payload_read = false;
        return true;
      }
      pos += kBlock;
      // Links, directories, devices and FIFOs have no payload whatever their
      // size field says; unknown types are skipped by their size, as tarfile does.
      const bool known_no_data = (type >= '1' && type <= '6') || type == '\0';
      at_member_start = false;
      if (!known_no_data) skip(size + padding(size), name, first, size, "data");
      at_member_start = true;
      in_chain = false;
      local.clear();
      has_long_name = false;
    }
  }
};

TarStream::TarStream(std::unique_ptr<ByteSource> source, size_t buffer_bytes, bool in_place)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.src = std::move(source);
  if (in_place) s.mapping = s.src->map_file();
  if (s.mapping) {
    // All of it is "in the buffer" from the start; read() is never called.
    s.win = s.mapping->data();
    s.cap = s.end = static_cast<size_t>(s.mapping->size());
    s.eof = true;
  } else {
    s.buf.resize(std::max<size_t>(buffer_bytes, 4 * kBlock));
    s.win = s.buf.data();
    s.cap = s.buf.size();
  }
}

TarStream::~TarStream() = default;

bool TarStream::next(TarMember& member) {
  if (!impl_->next_member()) return false;
  member = impl_->cur;
  return true;
}

void TarStream::read_payload(std::vector<uint8_t>& dst) {
  Impl& s = *impl_;
  s.at_member_start = false;
  CHUTE_CHECK(s.have_cur && !s.payload_read && s.cur.fault.empty(), kUsage,
              "tar archive '" << s.url() << "': read_payload without a current readable member");
  s.payload_read = true;
  if (s.cur.sparse) {
    s.expand_sparse(dst);
  } else {
    s.copy_out(dst, s.cur.size, s.cur.name, s.cur.header_offset, s.cur.size, "data");
  }
}

const uint8_t* TarStream::payload_in_place() {
  Impl& s = *impl_;
  s.at_member_start = false;
  CHUTE_CHECK(s.mapping && s.have_cur && !s.payload_read && !s.cur.sparse && s.cur.fault.empty(),
              kUsage,
              "tar archive '" << s.url()
                              << "': payload_in_place without a mapping or a current plain member");
  s.payload_read = true;
  if (s.cur.size > s.avail()) {
    s.pos = s.end;
    s.truncated(s.cur.name, s.cur.header_offset, s.cur.size, "data");
  }
  const uint8_t* payload = s.win + s.pos;
  s.pos += static_cast<size_t>(s.cur.size);
  return payload;
}

const std::shared_ptr<MappedFile>& TarStream::mapping() const { return impl_->mapping; }

const std::string& TarStream::url() const { return impl_->url(); }

bool TarStream::failed_at_a_member_start() const { return impl_->at_member_start; }

MemberHeaders parse_member_headers(const uint8_t* bytes, size_t n, const std::string& url,
                                   uint64_t offset) {
  PaxOverrides pax;
  const PaxOverrides none;
  std::string long_name;
  bool has_long_name = false;
  size_t pos = 0;
  for (;;) {
    CHUTE_CHECK(pos + kBlock <= n, kData,
                "tar archive '" << url << "': no member header in the " << n
                                << " bytes at offset " << offset);
    const uint8_t* h = bytes + pos;
    const uint64_t at = offset + pos;
    const uint32_t total = byte_sum(h);
    CHUTE_CHECK(total != 0 && checksum_ok(h, total), kData,
                "tar archive '" << url << "': no valid tar header at offset " << at);
    const char type = static_cast<char>(h[kType]);
    uint64_t size;
    CHUTE_CHECK(parse_number(h + kSize, kSizeLen, size), kData,
                "tar archive '" << url << "': bad size field in the header at offset " << at);
    pos += kBlock;
    if (type == 'L' || type == 'K' || type == 'x' || type == 'X' || type == 'g') {
      CHUTE_CHECK(size <= n - pos, kData,
                  "tar archive '" << url << "': the '" << type << "' extension header at offset "
                                  << at << " runs past the " << n << " bytes read");
      const std::string_view record(reinterpret_cast<const char*>(h + kBlock),
                                    static_cast<size_t>(size));
      if (type == 'L') {
        has_long_name = true;
        long_name.assign(record.substr(0, record.find('\0')));  // up to the first NUL, as tar reads it
      } else if (type == 'x' || type == 'X' || type == 'g') {
        parse_pax_records(record, pax, url, at);
      }
      pos += static_cast<size_t>(size + padding(size));
      continue;
    }
    const size_t raw_len = field_len(h + kName, kNameLen);
    const bool raw_dir_slash = raw_len > 0 && h[kName + raw_len - 1] == '/';
    const bool regular = type == '0' || type == '7' || (type == '\0' && !raw_dir_slash);
    CHUTE_CHECK(regular && !pax.sparse(), kData,
                "tar archive '" << url << "': the header at offset " << at
                                << " is not a plain file's (type '" << type << "')");
    MemberHeaders out;
    resolve_member(h, pax, none, has_long_name ? &long_name : nullptr, out.name, size);
    out.size = size;
    out.header_bytes = pos;
    return out;
  }
}

}  // namespace chute

#include "tar/sample_key.h"

#include "tar/unicode_lower.h"

namespace chute {
namespace {

// webdataset's tar_file_iterator drops metadata members: a top-level
// `__name__`, or any path whose first component matches `__[^/]*__`
// (re.match of r"__[^/]*__($|/)").
bool is_meta_name(const std::string& name) {
  const size_t slash = name.find('/');
  const size_t first_len = slash == std::string::npos ? name.size() : slash;
  if (first_len < 2 || name.compare(0, 2, "__") != 0) return false;
  if (first_len < 4) return slash == std::string::npos && first_len == name.size() &&
                            name.compare(name.size() - 2, 2, "__") == 0;
  return name.compare(first_len - 2, 2, "__") == 0;
}

// The regex puts the key's end at the first dot of the basename, provided
// the text before that dot splits into `(?:.*/|)` (empty, or a prefix that
// ends in '/' and holds no newline, since `.` stops at one) and a non-empty
// `[^.]+`. The shortest such prefix is the likeliest to have no newline:
// none when the directories hold no dot, else the one ending at the first
// slash after their last dot.
std::optional<size_t> key_length(const std::string& name) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string::npos) return std::nullopt;
  const size_t dir_dot = base == 0 ? std::string::npos : name.rfind('.', base - 1);
  size_t prefix = 0;
  if (dir_dot != std::string::npos) {
    prefix = name.find('/', dir_dot) + 1;
    if (name.find('\n') < prefix) return std::nullopt;
  }
  if (dot == prefix) return std::nullopt;  // `[^.]+` would be empty
  return dot;
}

}  // namespace

std::optional<size_t> sample_key_length(const std::string& name) {
  if (is_meta_name(name)) return std::nullopt;
  return key_length(name);
}

std::string sample_extension(const std::string& name, size_t key_length) {
  return lower_like_python(name.substr(key_length + 1));
}

std::optional<SampleKey> split_sample_key(const std::string& name) {
  const std::optional<size_t> length = sample_key_length(name);
  if (!length) return std::nullopt;
  return SampleKey{*length, sample_extension(name, *length)};
}

}  // namespace chute

// webdataset's rule for grouping tar members into samples, in one place: the
// sample reader groups by it and the inspection bindings (chute index,
// chute inspect) report it, so the two can never disagree.
//
// The key is the member path up to the first dot of its basename, the
// extension the rest, lowercased as Python lowercases it (webdataset's
// base_plus_ext regex `^((?:.*/|)[^.]+)[.]([^/]*)$` and `suffix.lower()`,
// tar/unicode_lower.h). Metadata members (a
// first path component matching `__[^/]*__`) and names the regex does not
// match are dropped. Names are bytes here; Python sees them decoded as UTF-8
// with surrogateescape, as tarfile decodes them, and the rule gives the same
// split on either form since every byte it looks at ('.', '/', '\n', '_') is
// ASCII.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace chute {

struct SampleKey {
  size_t key_length = 0;  // the key is name[0, key_length); a dot follows it
  std::string extension;  // name after that dot, lowercased
};

// The key and extension of member `name`, or nothing when webdataset drops it.
std::optional<SampleKey> split_sample_key(const std::string& name);

// Length of the key of `name` (the extension starts one byte later), or
// nothing when webdataset drops the member.
std::optional<size_t> sample_key_length(const std::string& name);

// The extension of `name` whose key is `key_length` bytes long.
std::string sample_extension(const std::string& name, size_t key_length);


}  // namespace chute

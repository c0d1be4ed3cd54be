// Python's str.lower() on bytes that Python would decode as UTF-8 with
// surrogateescape (as tarfile decodes member names): what webdataset does
// to an extension. Valid UTF-8 is lowered code point by code point (full
// mappings, U+0130 to "i̇", and U+03A3 to final ς at the end of a word);
// bytes that are not valid UTF-8 stay as they are, as their escapes do.
#pragma once

#include <string>

namespace chute {

std::string lower_like_python(const std::string& bytes);

}  // namespace chute

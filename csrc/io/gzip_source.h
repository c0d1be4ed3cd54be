// Compressed shards: a source whose first bytes are the gzip magic (1f 8b) is
// inflated while it streams, as webdataset's tarfile.open(mode="r|*") reads
// `.tgz` / `.tar.gz` shards; the name of the shard does not matter. bzip2, xz
// and zstd streams are recognised by their magic and refused with a message
// that says how to read them (through a `pipe:` that decompresses).
#pragma once

#include <memory>

#include "io/byte_source.h"

namespace chute {

// `source` as the bytes of the archive it holds: inflated when it is gzip
// (any number of concatenated members; a stream that ends inside a member is
// a kData error naming the url and "gzip", never a clean end), unchanged
// otherwise. A gzip source cannot be mapped for reading in place. Opening
// reads nothing: the first read() looks at the first bytes (and throws for
// bzip2/xz/zstd), map_file() at the mapping's.
std::unique_ptr<ByteSource> open_decompressed(std::unique_ptr<ByteSource> source);

}  // namespace chute

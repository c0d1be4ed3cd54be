// Byte sources for objects in remote stores (http(s), S3, GCS, Azure, the
// Hugging Face Hub), read through a FetchQueue (see fetch_queue.h).
//
// Opening a source sends a HEAD (size and ETag) and returns at once; the
// object is then read in ranges of `range_bytes` with up to `max_in_flight`
// requested ahead, so opening a source early is how a reader prefetches it.
// read() returns bytes as soon as the range under the read position has
// arrived: parsing starts while the object is still arriving. Ranges carry
// If-Match with the object's ETag (when it has one), so an object replaced
// mid-read fails instead of mixing two versions, and a response shorter than
// its range is retried and never delivered as data: the reader sees either
// every byte of the object or an error (kIo) that names the url and the
// byte range.
//
// With a cache directory (see object_cache.h) the source, once the HEAD is
// back, either
//   - finds the object cached with the same size and version and, once the
//     reader has checked the whole file against the CRC-32C recorded when it
//     was downloaded, reads it as a local file (map_file() works: the
//     in-place path); a file that fails the check is dropped and the object
//     downloaded again (counted in the queue's stats and in
//     SourceOptions::counters), or
//   - downloads it: ranges are written in order to `<name>+part` while the
//     reader reads that file behind them; the file is published as `<name>`
//     when complete (the download continues while the reader lags; it is
//     abandoned if the source is closed first), after making room under
//     cache_limit_bytes, or
//   - follows another process's download of the same version, reading its
//     part file as it grows; if that process stops, the rest is fetched
//     directly (not cached).
// An object larger than the cache limit, or one whose part file cannot be
// written, is read without caching.
//
// Every wait polls SourceOptions::cancel and the queue's closing, and is
// bounded: a reader that receives nothing for longer than all attempts of a
// request could take fails with kTimeout.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/byte_source.h"

namespace chute {

// A url scheme read through SourceOptions::remote. remote_schemes() is the
// one list of them: chute.remote reads it (_core.remote_schemes()) to know
// its urls and which store opens each, and tests hold the docs' lists to it.
struct RemoteScheme {
  std::string name;                  // as urls spell it, lower case ("s3")
  std::vector<std::string> aliases;  // other names read the same way ("s3a")
  // The kind of store chute.remote opens for it, one of the STORES of
  // python/chute/remote/_stores.py ("s3", "http", ...).
  std::string store;
  // What the store is, in the docs' table of schemes (docs/remote.md, written
  // by scripts/gen_docs_tables.py): "a web server".
  std::string store_title;
};
const std::vector<RemoteScheme>& remote_schemes();
// "http://, https://, s3://, s3a://, ...": every name and alias, for messages.
std::string remote_scheme_list();
// Whether the url's scheme (in any case) is a RemoteScheme's name or alias.
bool is_remote_url(const std::string& url);

// Requires options.remote.
std::unique_ptr<ByteSource> open_remote_source(const std::string& url,
                                               const SourceOptions& options);

}  // namespace chute

// Tar shards read by sample id through their sidecar index: scanning a
// shard for the index python/chute/sources/tarindex.py writes, checking a
// remote shard's header digest, and TarIndexSource, which takes the index
// as numpy columns read from the sidecar files.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings/engine_face.h"
#include "bindings/registry.h"
#include "compose/catalog.h"
#include "compose/indexed_request.h"
#include "core/error.h"
#include "io/fetch_queue.h"
#include "tar/indexed_tar_source.h"
#include "tar/tar_index.h"

namespace py = pybind11;

namespace chute::bindings {

namespace {

template <typename T>
using Column = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
IndexColumn<T> column_view(const Column<T>& a) {
  return IndexColumn<T>{a.data(), static_cast<size_t>(a.size())};
}

// Names are bytes in the archive; tarfile (and so webdataset) decodes them as
// UTF-8 with surrogateescape.
py::str decode_name(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

std::shared_ptr<IndexedTarSource> make_tar_source(
    const std::vector<std::string>& urls, const std::vector<std::string>& paths,
    const std::vector<int64_t>& sizes, const std::vector<int64_t>& mtimes_ns,
    const std::vector<std::string>& versions, const std::vector<std::string>& extensions,
    const Column<int64_t>& shard_starts, const Column<int64_t>& sample_offsets,
    const Column<int64_t>& key_starts, const Column<uint8_t>& keys,
    const Column<int64_t>& member_starts, const Column<int32_t>& member_extensions,
    const Column<int64_t>& member_offsets, const Column<int64_t>& member_sizes,
    const Column<int64_t>& member_header_offsets, uint64_t max_gap, uint64_t max_read,
    size_t max_open, const std::optional<std::shared_ptr<FetchQueue>>& remote) {
  CHUTE_CHECK(paths.size() == urls.size() && sizes.size() == urls.size() &&
                  mtimes_ns.size() == urls.size() && versions.size() == urls.size(),
              kUsage,
              "tar index: urls, paths, sizes, modification times and versions differ in length");
  TarIndexRequest request;
  TarIndex& index = request.index;
  for (size_t i = 0; i < urls.size(); ++i) {
    index.shards.push_back({urls[i], paths[i], ShardIdentity{sizes[i], mtimes_ns[i], versions[i]}});
  }
  index.extensions = extensions;
  index.shard_starts = column_view(shard_starts);
  index.sample_offsets = column_view(sample_offsets);
  index.key_starts = column_view(key_starts);
  index.keys = IndexColumn<char>{reinterpret_cast<const char*>(keys.data()),
                                 static_cast<size_t>(keys.size())};
  index.member_starts = column_view(member_starts);
  index.member_extensions = column_view(member_extensions);
  index.member_offsets = column_view(member_offsets);
  index.member_sizes = column_view(member_sizes);
  index.member_header_offsets = column_view(member_header_offsets);
  // The arrays as converted (forcecast may have copied them) live as long as
  // the index.
  index.owner = keep_python_alive(py::make_tuple(shard_starts, sample_offsets, key_starts, keys,
                                                 member_starts, member_extensions, member_offsets,
                                                 member_sizes, member_header_offsets));
  request.options.max_gap = max_gap;
  request.options.max_read = max_read;
  request.options.max_open = max_open;
  // Remote urls are read with ranged requests through chute.remote's queue.
  if (remote) request.remote = *remote;
  return compose_tar_index_source(std::move(request));
}

// A header digest as an index records it: 16 hex digits.
std::string digest_hex(uint64_t digest) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
  return std::string(hex);
}

std::string tar_headers_digest(const std::string& url, const Column<int64_t>& header_offsets,
                               const Column<int64_t>& payload_offsets, int64_t size,
                               const std::string& version,
                               const std::optional<std::shared_ptr<FetchQueue>>& remote) {
  CHUTE_CHECK(header_offsets.size() == payload_offsets.size(), kUsage,
              "tar headers digest: " << header_offsets.size() << " header offsets for "
                                     << payload_offsets.size() << " payload offsets");
  // The digest runs over members in order; how they group into samples does not matter.
  std::vector<ScannedSample> samples(1);
  for (py::ssize_t i = 0; i < header_offsets.size(); ++i) {
    CHUTE_CHECK(header_offsets.data()[i] >= 0 && payload_offsets.data()[i] >= 0, kUsage,
                "tar headers digest: member " << i << " has a negative offset");
    ScannedMember m;
    m.header_offset = static_cast<uint64_t>(header_offsets.data()[i]);
    m.offset = static_cast<uint64_t>(payload_offsets.data()[i]);
    samples[0].members.push_back(m);
  }
  // Ranged reads of a remote shard: a daemon thread may be waiting on them
  // when Python exits.
  const uint64_t digest = without_gil([&] {
    const TarIndex::Shard shard{url, url, ShardIdentity{size, -1, version}};
    return header_digest(samples, *shard_reader_for(shard, remote ? *remote : nullptr));
  });
  return digest_hex(digest);
}

py::tuple scan_tar_index_py(const std::string& path) {
  std::vector<ScannedSample> samples;
  uint64_t digest = 0;
  without_gil([&] {  // a tar read, which a daemon thread may be in when Python exits
    SourceOptions options;
    std::optional<uint64_t> in_place;
    samples = scan_tar_index(open_source(path, options), &in_place);
    const TarIndex::Shard shard{path, path, ShardIdentity{}};
    digest = in_place ? *in_place : header_digest(samples, *shard_reader_for(shard, nullptr));
  });
  size_t members = 0;
  for (const ScannedSample& s : samples) members += s.members.size();
  py::list keys, extensions;
  py::array_t<int64_t> offsets(static_cast<py::ssize_t>(samples.size()));
  py::array_t<int64_t> counts(static_cast<py::ssize_t>(samples.size()));
  py::array_t<int64_t> member_offsets(static_cast<py::ssize_t>(members));
  py::array_t<int64_t> member_sizes(static_cast<py::ssize_t>(members));
  py::array_t<int64_t> member_header_offsets(static_cast<py::ssize_t>(members));
  int64_t* off = offsets.mutable_data();
  int64_t* cnt = counts.mutable_data();
  int64_t* moff = member_offsets.mutable_data();
  int64_t* msize = member_sizes.mutable_data();
  int64_t* mheader = member_header_offsets.mutable_data();
  size_t j = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const ScannedSample& s = samples[i];
    keys.append(decode_name(s.key));
    off[i] = static_cast<int64_t>(s.offset);
    cnt[i] = static_cast<int64_t>(s.members.size());
    for (const ScannedMember& m : s.members) {
      extensions.append(decode_name(m.extension));
      moff[j] = static_cast<int64_t>(m.offset);
      msize[j] = static_cast<int64_t>(m.size);
      mheader[j] = static_cast<int64_t>(m.header_offset);
      ++j;
    }
  }
  return py::make_tuple(keys, offsets, counts, extensions, member_offsets, member_sizes,
                        member_header_offsets, digest_hex(digest));
}

}  // namespace

void register_tar_index(py::module_& m) {
  m.def("scan_tar_index", &scan_tar_index_py, py::arg("path"),
        "The content of a tar shard's sidecar index, grouped by the engine's key rule: "
        "(keys, sample header offsets, members per sample, member extensions, payload offsets, "
        "payload sizes, header offsets, header digest), the member columns in archive order; "
        "the digest (16 hex digits) covers the bytes of those members' headers.");

  m.def("tar_headers_digest", &tar_headers_digest, py::arg("url"), py::arg("header_offsets"),
        py::arg("payload_offsets"), py::arg("size"), py::arg("version") = "",
        py::arg("remote") = py::none(),
        "The header digest of a tar shard as scan_tar_index gives it, read at the members' "
        "header offsets (up to each payload offset) in one batch of ranged requests: through "
        "the FetchQueue `remote` for a remote url, else from the local file. The shard must "
        "have `size` bytes (and `version`, when given) or DataError is raised.");

  py::class_<IndexedTarSource, IndexedSampleSource, std::shared_ptr<IndexedTarSource>>(
      m, "TarIndexSource",
      "Tar shards read by sample id through their index; neighbouring samples share a read.")
      .def(py::init(&make_tar_source), py::arg("urls"), py::arg("paths"), py::arg("sizes"),
           py::arg("mtimes_ns"), py::arg("versions"), py::arg("extensions"),
           py::arg("shard_starts"), py::arg("sample_offsets"), py::arg("key_starts"),
           py::arg("keys"), py::arg("member_starts"), py::arg("member_extensions"),
           py::arg("member_offsets"), py::arg("member_sizes"), py::arg("member_header_offsets"),
           py::arg("max_gap") = IndexedTarOptions{}.max_gap,
           py::arg("max_read") = IndexedTarOptions{}.max_read,
           py::arg("max_open") = IndexedTarOptions{}.max_open, py::arg("remote") = py::none())
      .def_property_readonly("reads", &IndexedTarSource::reads, "Range reads made so far.")
      .def_property_readonly("bytes_read", &IndexedTarSource::bytes_read,
                             "Bytes those reads brought in.");
}

const BindingsFile kTarIndexBindings{"_core", "tar_index", {"indexed", "remote"},
                                     register_tar_index};

}  // namespace chute::bindings

// Inspection bindings for tar shards: what the engine's reader sees, as
// Python objects. Parsing runs without the GIL into C++ structures, which are
// converted only afterwards.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/engine_face.h"
#include "bindings/registry.h"
#include "bindings/text.h"
#include "io/byte_source.h"
#include "tar/sample_key.h"
#include "tar/sample_reader.h"
#include "tar/tar_stream.h"

namespace py = pybind11;

namespace chute::bindings {
namespace {

// `source` (for remote urls: chute.remote's reader and cache) is the base;
// a cache_dir or pipe timeout given on its own still applies.
using Source = std::optional<SourceOptions>;
SourceOptions make_options(const std::string& cache_dir, double pipe_timeout_s,
                           const Source& source) {
  SourceOptions options = source.value_or(SourceOptions{});
  if (!cache_dir.empty()) options.cache_dir = cache_dir;
  if (pipe_timeout_s > 0) options.pipe_timeout_s = pipe_timeout_s;
  return options;
}

// A shard held in memory: lets the fuzzer (and tests) drive the parser
// without a file per input.
class BytesSource final : public ByteSource {
 public:
  BytesSource(std::string data, std::string name) : data_(std::move(data)), name_(std::move(name)) {}
  size_t read(uint8_t* dst, size_t n) override {
    const size_t k = std::min(n, data_.size() - pos_);
    std::memcpy(dst, data_.data() + pos_, k);
    pos_ += k;
    return k;
  }
  const std::string& url() const override { return name_; }

 private:
  std::string data_;
  std::string name_;
  size_t pos_ = 0;
};

py::list samples_to_list(const std::vector<EncodedSample>& samples);

py::list read_tar_samples(const std::string& url, const std::string& cache_dir,
                          double pipe_timeout_s, const Source& source) {
  std::vector<EncodedSample> samples;
  // tokenize_shards' reader, a daemon thread, may be here when Python exits.
  without_gil([&] {
    SampleReader reader(open_source(url, make_options(cache_dir, pipe_timeout_s, source)), 0);
    EncodedSample sample;
    while (reader.next(sample)) samples.push_back(std::move(sample));
  });
  return samples_to_list(samples);
}

py::list read_tar_bytes(const py::bytes& data, const std::string& name) {
  std::vector<EncodedSample> samples;
  std::string copy = data;
  without_gil([&] {  // as read_tar_samples, from tokenize_shards' reader
    SampleReader reader(std::make_unique<BytesSource>(std::move(copy), name), 0);
    EncodedSample sample;
    while (reader.next(sample)) samples.push_back(std::move(sample));
  });
  return samples_to_list(samples);
}

py::list samples_to_list(const std::vector<EncodedSample>& samples) {
  py::list result;
  for (const EncodedSample& s : samples) {
    py::dict fields;
    for (const SampleMember& m : s.members) {
      fields[name_text(m.extension)] = py::bytes(
          reinterpret_cast<const char*>(s.bytes() + m.data_begin), m.data_size);
    }
    result.append(py::make_tuple(name_text(s.key), fields, s.offset));
  }
  return result;
}

// Every member of a shard, parsed with the GIL released; with `until_error`,
// the members whose headers were read before an error that ends the archive
// (the last one's payload may lie past it), and no error.
std::vector<TarMember> read_members(const std::string& url, const std::string& cache_dir,
                                    double pipe_timeout_s, const Source& source,
                                    bool until_error) {
  py::gil_scoped_release release;
  std::vector<TarMember> members;
  try {
    TarStream stream(open_source(url, make_options(cache_dir, pipe_timeout_s, source)));
    TarMember m;
    while (stream.next(m)) members.push_back(m);
  } catch (const Error&) {
    if (!until_error) throw;
  }
  return members;
}

// Every regular-file member: its name, header offset and size, where its
// payload starts (what a sidecar index needs to read a member with one
// pread: PAX/GNU extension headers make the distance from header to payload
// variable; None when the payload is not one range: a sparse file) and the
// member's key and extension by the reader's rule (None for members it
// skips).
py::list list_tar_payloads(const std::string& url, const std::string& cache_dir,
                           double pipe_timeout_s, const Source& source, bool until_error) {
  py::list result;
  for (const TarMember& m :
       read_members(url, cache_dir, pipe_timeout_s, source, until_error)) {
    const std::optional<SampleKey> split = split_sample_key(m.name);
    py::object key = py::none(), extension = py::none();
    if (split) {
      key = name_text(m.name.substr(0, split->key_length));
      extension = name_text(split->extension);
    }
    // A sparse member's payload is not one range of the shard.
    const py::object data_offset =
        m.sparse || !m.fault.empty() ? py::none() : py::object(py::int_(m.data_offset));
    result.append(py::make_tuple(name_text(m.name), m.header_offset, data_offset, m.size, key,
                                 extension));
  }
  return result;
}

// What a shard holds up to its first error and past it, counted as the
// engine delivers samples: under a handler that raises, the samples before
// the first error (a sample the error flawed is not among them); under one
// that goes on, the samples delivered (flawed ones included) and lost.
py::dict count_tar_samples(const std::string& url, const std::string& cache_dir,
                           double pipe_timeout_s, const Source& source) {
  uint64_t raising = 0, skipping = 0, lost = 0;
  std::vector<std::string> errors;
  {
    py::gil_scoped_release release;
    SampleReader reader(open_source(url, make_options(cache_dir, pipe_timeout_s, source)), 0);
    EncodedSample sample;
    bool stopped = false;
    for (;;) {
      try {
        if (!reader.next(sample)) break;
      } catch (const Error& e) {
        errors.push_back(e.message());
        stopped = true;
        lost += reader.failure().samples_lost;
        if (reader.failure().resumable) continue;
        break;
      }
      stopped = stopped || sample.flawed;
      raising += stopped ? 0 : 1;
      skipping += 1;
    }
  }
  py::dict d;
  d["samples"] = raising;
  d["samples_skipping"] = skipping;
  d["samples_lost"] = lost;
  py::list messages;
  for (const std::string& e : errors) messages.append(message_text(e));
  d["errors"] = messages;
  return d;
}

// Times the reader alone (no Python objects), for benchmarks and shard checks.
py::dict scan_tar_samples(const std::string& url, const std::string& cache_dir,
                          double pipe_timeout_s, const Source& source) {
  uint64_t samples = 0, members = 0, bytes = 0;
  double seconds = 0;
  {
    py::gil_scoped_release release;
    const auto t0 = std::chrono::steady_clock::now();
    SampleReader reader(open_source(url, make_options(cache_dir, pipe_timeout_s, source)), 0);
    EncodedSample sample;
    while (reader.next(sample)) {
      ++samples;
      members += sample.members.size();
      bytes += sample.data.size();
      // A fresh object per sample, as when samples are moved into a shuffle buffer.
      EncodedSample moved = std::move(sample);
      sample = EncodedSample();
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  py::dict d;
  d["samples"] = samples;
  d["members"] = members;
  d["payload_bytes"] = bytes;
  d["seconds"] = seconds;
  return d;
}

}  // namespace

void register_tar(py::module_& m) {
  m.def(
      "peek_tar_sample",
      [](const std::string& url, const std::string& cache_dir, double pipe_timeout,
         const Source& source, bool skip_errors) -> py::object {
        std::vector<std::string> extensions;
        bool found = false;
        {
          py::gil_scoped_release release;
          SampleReader reader(open_source(url, make_options(cache_dir, pipe_timeout, source)), 0);
          EncodedSample sample;
          // Under a handler that goes on, the first sample the engine would
          // deliver: past bad samples, a flawed one as it was read.
          for (;;) {
            try {
              found = reader.next(sample);
            } catch (const Error&) {
              if (!skip_errors) throw;
              if (reader.failure().resumable) continue;
              found = false;
            }
            break;
          }
          for (const SampleMember& m : sample.members) extensions.push_back(m.extension);
        }
        if (!found) return py::none();
        return name_list(extensions);
      },
      py::arg("url"), py::arg("cache_dir") = "", py::arg("pipe_timeout") = 0.0,
      py::arg("source") = py::none(), py::arg("skip_errors") = false,
      "Member extensions of the first sample of a shard, or None for a shard without one. "
      "With skip_errors, errors are passed over as a handler that goes on passes them (None "
      "when the shard ends at one before any sample).");
  m.def("read_tar_samples", &read_tar_samples, py::arg("url"), py::arg("cache_dir") = "",
        py::arg("pipe_timeout_s") = 0.0, py::arg("source") = py::none(),
        "Reads a tar shard with the engine's reader: [(key, {extension: payload}, offset)].");
  m.def("read_tar_bytes", &read_tar_bytes, py::arg("data"), py::arg("name") = "<bytes>",
        "read_tar_samples for a shard held in memory (`name` stands for it in errors): "
        "tokenize_shards reads a gzip-compressed shard so, and the fuzzer drives the parser "
        "without a file per input.");
  m.def("list_tar_payloads", &list_tar_payloads, py::arg("url"), py::arg("cache_dir") = "",
        py::arg("pipe_timeout_s") = 0.0, py::arg("source") = py::none(),
        py::arg("until_error") = false,
        "Regular-file members of a tar shard: [(name, header offset, payload offset, size, key, "
        "extension)]; the payload offset is None for a sparse file (not one range of the "
        "shard), key and extension None for members the reader skips. With until_error, the "
        "members whose headers come before an error that ends the archive, instead of the "
        "error.");
  m.def("count_tar_samples", &count_tar_samples, py::arg("url"), py::arg("cache_dir") = "",
        py::arg("pipe_timeout_s") = 0.0, py::arg("source") = py::none(),
        "Samples of a tar shard as the engine delivers them: {'samples': before the first error, "
        "'samples_skipping': delivered under a handler that goes on, 'samples_lost': lost under "
        "it, 'errors': the messages}.");
  m.def("scan_tar_samples", &scan_tar_samples, py::arg("url"), py::arg("cache_dir") = "",
        py::arg("pipe_timeout_s") = 0.0, py::arg("source") = py::none(),
        "Parses a tar shard into samples without building Python objects; returns counts and "
        "the parse time in seconds (measured in C++).");
  m.def("tar_cache_file_name", &cache_file_name, py::arg("url"),
        "File name under cache_dir for a pipe: url.");
}

const BindingsFile kTarBindings{"_core", "tar", {"remote"}, register_tar};

}  // namespace chute::bindings

// Byte-level readers of remote urls (io/remote_ranges.h, remote_source.h),
// read through a FetchQueue (fetch_queue_bindings.cc), and how urls are
// reached (SourceOptions). No native thread ever calls back into Python.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/engine_face.h"
#include "bindings/registry.h"
#include "core/error.h"
#include "io/byte_source.h"
#include "io/fetch_queue.h"
#include "io/remote_ranges.h"
#include "io/remote_source.h"
#include "tar/sample_reader.h"

namespace py = pybind11;

namespace chute::bindings {
namespace {

SourceOptions remote_options(const std::shared_ptr<FetchQueue>& queue,
                             const std::string& cache_dir, uint64_t cache_limit_bytes,
                             bool cache_fsync) {
  SourceOptions options;
  options.remote = queue;
  options.cache_dir = cache_dir;
  options.cache_limit_bytes = cache_limit_bytes;
  options.cache_fsync = cache_fsync;
  return options;
}

// A remote url opened as a byte stream. close() may come from another thread
// while read() waits: it raises the cancel flag first, so the wait ends
// within a poll interval, then takes the source down. Block readers (daemon
// threads) open and read them, so each wait releases the GIL through
// without_gil (ReleasedGil).
class RemoteReader {
 public:
  RemoteReader(const std::string& url, const std::shared_ptr<FetchQueue>& queue,
               const std::string& cache_dir, uint64_t cache_limit_bytes, bool cache_fsync) {
    SourceOptions options = remote_options(queue, cache_dir, cache_limit_bytes, cache_fsync);
    options.cancel = &cancel_;
    // The object's bytes, never inflated.
    without_gil([&] { source_ = open_stored_source(url, options); });
  }

  ~RemoteReader() {
    cancel_.store(true);
    std::lock_guard<std::mutex> lock(mu_);
    source_.reset();
  }

  RemoteReader(const RemoteReader&) = delete;
  RemoteReader& operator=(const RemoteReader&) = delete;

  py::bytes read(int64_t n) {
    std::string out;
    without_gil([&] {
      std::lock_guard<std::mutex> lock(mu_);
      CHUTE_CHECK(source_ != nullptr, kUsage, "read from a closed remote reader");
      const Reading reading(reading_);
      constexpr size_t kStep = size_t{1} << 20;
      size_t want = n < 0 ? SIZE_MAX : static_cast<size_t>(n);
      while (want > 0) {
        const size_t step = std::min(want, kStep);
        const size_t old = out.size();
        out.resize(old + step);
        const size_t got = source_->read(reinterpret_cast<uint8_t*>(&out[old]), step);
        out.resize(old + got);
        if (got == 0) break;
        want -= got;
      }
    });
    return py::bytes(out);
  }

  // Whether a read() holds the reader now: a close() then waits for it to
  // give up (tests wait for this rather than for time).
  bool reading() const { return reading_.load(); }

  // Whether the object is read in place from a file mapping (a cache hit).
  bool in_place() {
    return without_gil([&] {
      std::lock_guard<std::mutex> lock(mu_);
      return source_ != nullptr && source_->map_file() != nullptr;
    });
  }

  void close() {
    cancel_.store(true);
    without_gil([&] {
      std::lock_guard<std::mutex> lock(mu_);
      source_.reset();
    });
  }

  // Reads the rest without keeping it: with a cache directory, what makes
  // the object a complete cache entry. Returns the bytes read.
  uint64_t drain() {
    return without_gil([&] {
      std::lock_guard<std::mutex> lock(mu_);
      CHUTE_CHECK(source_ != nullptr, kUsage, "read from a closed remote reader");
      std::vector<uint8_t> buffer(size_t{1} << 20);
      uint64_t total = 0;
      while (const size_t got = source_->read(buffer.data(), buffer.size())) total += got;
      return total;
    });
  }

 private:
  struct Reading {
    explicit Reading(std::atomic<bool>& flag) : flag_(flag) { flag_.store(true); }
    ~Reading() { flag_.store(false); }
    Reading(const Reading&) = delete;
    Reading& operator=(const Reading&) = delete;
    std::atomic<bool>& flag_;
  };

  std::atomic<bool> cancel_{false};
  std::atomic<bool> reading_{false};
  std::mutex mu_;
  std::unique_ptr<ByteSource> source_;
};

// Random access to a remote object (io/remote_ranges.h) for Python readers
// of metadata (h5py's file-like objects, inspection). close() from another
// thread stops a read in progress.
class PyRemoteRanges {
 public:
  PyRemoteRanges(const std::string& url, const std::shared_ptr<FetchQueue>& queue) {
    // The HEAD's wait, in a daemon thread that opens a shard, too.
    without_gil([&] { ranges_ = std::make_unique<RemoteRanges>(url, queue, &cancel_); });
  }
  uint64_t size() const { return ranges_->size(); }
  const std::string& version() const { return ranges_->version(); }
  uint64_t ranges_fetched() const { return ranges_->ranges_fetched(); }
  py::bytes read(uint64_t offset, size_t size) {
    std::string out(size, '\0');
    std::exception_ptr failure;
    {
      // Python threads reading for an engine (Parquet row groups) are
      // daemons: one may be waiting here when Python exits.
      ReleasedGil released;  // never left by an exception (engine_face.h)
      try {
        ranges_->read(offset, size, reinterpret_cast<uint8_t*>(out.data()));
      } catch (...) {
        failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
    return py::bytes(out);
  }
  void close() { cancel_.store(true); }

 private:
  std::atomic<bool> cancel_{false};
  std::unique_ptr<RemoteRanges> ranges_;
};

// The samples of a remote tar shard, parsed by the engine's reader while the
// shard arrives: read_tar_samples' tuples (names decoded as strict UTF-8).
std::vector<std::tuple<std::string, std::map<std::string, py::bytes>, uint64_t>> read_remote_tar(
    const std::string& url, const std::shared_ptr<FetchQueue>& queue, const std::string& cache_dir,
    uint64_t cache_limit_bytes, bool in_place) {
  std::vector<EncodedSample> samples;
  without_gil([&] {
    SampleReader reader(open_source(url, remote_options(queue, cache_dir, cache_limit_bytes, true)),
                        0, in_place);
    EncodedSample sample;
    while (reader.next(sample)) samples.push_back(std::move(sample));
  });
  std::vector<std::tuple<std::string, std::map<std::string, py::bytes>, uint64_t>> out;
  for (const EncodedSample& s : samples) {
    std::map<std::string, py::bytes> fields;
    for (const SampleMember& m : s.members) {
      fields[m.extension] =
          py::bytes(reinterpret_cast<const char*>(s.bytes() + m.data_begin), m.data_size);
    }
    out.emplace_back(s.key, std::move(fields), s.offset);
  }
  return out;
}

}  // namespace

void register_remote(py::module_& m) {
  py::class_<SourceOptions>(
      m, "SourceOptions",
      "How urls are reached (csrc/io/byte_source.h): the pipe: and remote cache, the remote "
      "reader (a FetchQueue) for http(s)://, s3://, ... urls.")
      .def(py::init<>())
      .def_readwrite("cache_dir", &SourceOptions::cache_dir)
      .def_readwrite("cache_limit_bytes", &SourceOptions::cache_limit_bytes)
      .def_readwrite("cache_fsync", &SourceOptions::cache_fsync)
      .def_readwrite("pipe_timeout", &SourceOptions::pipe_timeout_s)
      .def_readwrite("readahead_bytes", &SourceOptions::readahead_bytes)
      .def_readwrite("remote", &SourceOptions::remote, "None: remote urls cannot be read.");

  py::class_<PyRemoteRanges>(m, "RemoteRanges",
                          "Byte ranges of a remote object, read through a FetchQueue.")
      .def(py::init<const std::string&, const std::shared_ptr<FetchQueue>&>(), py::arg("url"),
           py::arg("queue"), "Sends the HEAD and waits for it; raises ReadError naming the url.")
      .def_property_readonly("size", &PyRemoteRanges::size)
      .def_property_readonly("version", &PyRemoteRanges::version,
                             "The ETag (else the modification time) the HEAD gave.")
      .def_property_readonly("ranges_fetched", &PyRemoteRanges::ranges_fetched)
      .def("read", &PyRemoteRanges::read, py::arg("offset"), py::arg("size"),
           "Exactly bytes [offset, offset + size); raises ReadError (DataError past the end).")
      .def("close", &PyRemoteRanges::close, "Stops a read in progress (in any thread).");

  py::class_<RemoteReader>(m, "RemoteReader", "A remote url read as a byte stream.")
      .def(py::init<const std::string&, const std::shared_ptr<FetchQueue>&, const std::string&,
                    uint64_t, bool>(),
           py::arg("url"), py::arg("queue"), py::arg("cache_dir") = "",
           py::arg("cache_limit_bytes") = 0, py::arg("cache_fsync") = true)
      .def("read", &RemoteReader::read, py::arg("n") = -1,
           "Up to n bytes (all that is left when n < 0); b'' at the end.")
      .def_property_readonly("reading", &RemoteReader::reading,
                             "Whether a read() is in progress (a close() ends it).")
      .def_property_readonly("in_place", &RemoteReader::in_place,
                             "Whether the object is read from a mapped local file (a cache hit).")
      .def("close", &RemoteReader::close, "Stops any read in progress and releases the object.")
      .def("drain", &RemoteReader::drain,
           "Reads the rest and drops it (with a cache directory: completes the cache entry); "
           "returns the bytes read.");

  m.def("read_remote_tar", &read_remote_tar, py::arg("url"), py::arg("queue"),
        py::arg("cache_dir") = "", py::arg("cache_limit_bytes") = 0, py::arg("in_place") = false,
        "The samples of a remote tar shard, as read_tar_samples returns them.");
}

const BindingsFile kRemoteBindings{"_core", "remote", {"fetch_queue"}, register_remote};

}  // namespace chute::bindings

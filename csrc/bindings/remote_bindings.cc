// The native half of remote reading (csrc/io/fetch_queue.h, remote_source.h):
// the fetch queue as chute.remote's executor sees it, and byte-level readers
// of remote urls. Completing a request copies the fetched bytes into the
// engine with the GIL released; no native thread ever calls back into Python.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

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

ErrorKind parse_kind(const std::string& kind) {
  if (kind == "io") return ErrorKind::kIo;
  if (kind == "timeout") return ErrorKind::kTimeout;
  if (kind == "usage") return ErrorKind::kUsage;
  if (kind == "data") return ErrorKind::kData;
  throw py::value_error("unknown failure kind '" + kind + "' (io, timeout, usage or data)");
}

// One popped request, as the executor holds it until it answers.
class FetchTicket {
 public:
  FetchTicket(std::shared_ptr<FetchQueue> queue, FetchRequest request)
      : queue_(std::move(queue)), request_(std::move(request)) {}

  uint64_t id() const { return request_.id; }
  std::string op() const { return request_.op == FetchOp::kHead ? "head" : "range"; }
  const std::string& url() const { return request_.url; }
  uint64_t offset() const { return request_.offset; }
  uint64_t length() const { return request_.length; }
  const std::string& if_match() const { return request_.if_match; }
  int attempt() const { return request_.attempt; }
  bool sequential() const { return request_.sequential; }

  void complete(const py::buffer& data) {
    const py::buffer_info info = data.request();
    CHUTE_CHECK(info.ndim <= 1 && (info.ndim == 0 || info.strides[0] == info.itemsize), kUsage,
                "a fetched range must be a contiguous buffer");
    const auto* bytes = static_cast<const uint8_t*>(info.ptr);
    const size_t n = static_cast<size_t>(info.size * info.itemsize);
    // `data` keeps the buffer alive and unchanged while the GIL is released.
    py::gil_scoped_release release;
    queue_->complete_range(request_.id, bytes, n);
  }

  void complete_head(uint64_t size, const std::string& etag, const std::string& version) {
    py::gil_scoped_release release;
    queue_->complete_head(request_.id, size, etag, version);
  }

  void fail(const std::string& kind, int status, const std::string& message, bool retryable) {
    const ErrorKind k = parse_kind(kind);
    py::gil_scoped_release release;
    queue_->fail(request_.id, k, status, message, retryable);
  }

 private:
  std::shared_ptr<FetchQueue> queue_;
  FetchRequest request_;
};

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
// within a poll interval, then takes the source down.
class RemoteReader {
 public:
  RemoteReader(const std::string& url, const std::shared_ptr<FetchQueue>& queue,
               const std::string& cache_dir, uint64_t cache_limit_bytes, bool cache_fsync) {
    SourceOptions options = remote_options(queue, cache_dir, cache_limit_bytes, cache_fsync);
    options.cancel = &cancel_;
    py::gil_scoped_release release;
    source_ = open_stored_source(url, options);  // the object's bytes, never inflated
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
    {
      py::gil_scoped_release release;
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
    }
    return py::bytes(out);
  }

  // Whether a read() holds the reader now: a close() then waits for it to
  // give up (tests wait for this rather than for time).
  bool reading() const { return reading_.load(); }

  // Whether the object is read in place from a file mapping (a cache hit).
  bool in_place() {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    return source_ != nullptr && source_->map_file() != nullptr;
  }

  void close() {
    cancel_.store(true);
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    source_.reset();
  }

  // Reads the rest without keeping it: with a cache directory, what makes
  // the object a complete cache entry. Returns the bytes read.
  uint64_t drain() {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    CHUTE_CHECK(source_ != nullptr, kUsage, "read from a closed remote reader");
    std::vector<uint8_t> buffer(size_t{1} << 20);
    uint64_t total = 0;
    while (const size_t got = source_->read(buffer.data(), buffer.size())) total += got;
    return total;
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
    py::gil_scoped_release release;
    ranges_ = std::make_unique<RemoteRanges>(url, queue, &cancel_);
  }
  uint64_t size() const { return ranges_->size(); }
  const std::string& version() const { return ranges_->version(); }
  uint64_t ranges_fetched() const { return ranges_->ranges_fetched(); }
  py::bytes read(uint64_t offset, size_t size) {
    std::string out(size, '\0');
    {
      py::gil_scoped_release release;
      ranges_->read(offset, size, reinterpret_cast<uint8_t*>(out.data()));
    }
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
  {
    py::gil_scoped_release release;
    SampleReader reader(open_source(url, remote_options(queue, cache_dir, cache_limit_bytes, true)),
                        0, in_place);
    EncodedSample sample;
    while (reader.next(sample)) samples.push_back(std::move(sample));
  }
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
  py::class_<FetchTicket>(m, "FetchTicket",
                          "A request taken from a FetchQueue; answer it exactly once.")
      .def_property_readonly("id", &FetchTicket::id)
      .def_property_readonly("op", &FetchTicket::op, "'head' or 'range'.")
      .def_property_readonly("url", &FetchTicket::url)
      .def_property_readonly("offset", &FetchTicket::offset)
      .def_property_readonly("length", &FetchTicket::length)
      .def_property_readonly("if_match", &FetchTicket::if_match,
                             "ETag the object must still have ('' for any).")
      .def_property_readonly("attempt", &FetchTicket::attempt, "0 on the first try.")
      .def_property_readonly("sequential", &FetchTicket::sequential,
                             "Whether the range was asked for by a reader that reads the object "
                             "in order (a source), not at random.")
      .def("complete", &FetchTicket::complete, py::arg("data"),
           "Delivers a range's bytes (copied with the GIL released). Fewer bytes than "
           "asked for count as a retryable failure.")
      .def("complete_head", &FetchTicket::complete_head, py::arg("size"), py::arg("etag"),
           py::arg("version"), "Answers a HEAD: size, ETag ('' if none), content version.")
      .def("fail", &FetchTicket::fail, py::arg("kind"), py::arg("status"), py::arg("message"),
           py::arg("retryable"),
           "kind: 'io', 'timeout', 'usage' or 'data'; status: HTTP status or 0. A "
           "retryable failure is retried after a backoff while attempts remain.");

  py::class_<FetchQueue, std::shared_ptr<FetchQueue>>(
      m, "FetchQueue",
      "Requests of remote byte sources, for chute.remote's executor (see "
      "csrc/io/fetch_queue.h).")
      .def(py::init([](uint64_t range_bytes, int max_in_flight, uint64_t prefetch_bytes,
                       int retries, double backoff_s, double max_backoff_s, double timeout_s) {
             FetchSettings s;
             s.range_bytes = range_bytes;
             s.max_in_flight = max_in_flight;
             s.prefetch_bytes = prefetch_bytes;
             s.retries = retries;
             s.backoff_s = backoff_s;
             s.max_backoff_s = max_backoff_s;
             s.timeout_s = timeout_s;
             return std::make_shared<FetchQueue>(s);
           }),
           py::arg("range_bytes") = FetchSettings{}.range_bytes,
           py::arg("max_in_flight") = FetchSettings{}.max_in_flight,
           py::arg("prefetch_bytes") = FetchSettings{}.prefetch_bytes,
           py::arg("retries") = FetchSettings{}.retries,
           py::arg("backoff_s") = FetchSettings{}.backoff_s,
           py::arg("max_backoff_s") = FetchSettings{}.max_backoff_s,
           py::arg("timeout_s") = FetchSettings{}.timeout_s)
      .def(
          "try_pop",
          [](const std::shared_ptr<FetchQueue>& q) -> std::optional<FetchTicket> {
            FetchRequest r;
            bool got;
            {
              py::gil_scoped_release release;
              got = q->try_pop(r);
            }
            if (!got) return std::nullopt;
            return FetchTicket(q, std::move(r));
          },
          "The next ready request, or None.")
      .def(
          "next_delay",
          [](FetchQueue& q) -> std::optional<double> {
            const double d = q.next_delay_s();
            if (d < 0) return std::nullopt;
            return d;
          },
          "Seconds until the next delayed retry is due, or None.")
      .def("take_cancelled", &FetchQueue::take_cancelled,
           "Ids of popped requests nobody wants any more (abort them).")
      .def_property_readonly("wake_fd", &FetchQueue::wake_fd,
                             "Readable when there is something to do (an eventfd).")
      .def("consume_wake", &FetchQueue::consume_wake)
      .def("close", &FetchQueue::close, py::call_guard<py::gil_scoped_release>(),
           "Fails everything queued or in flight and wakes the executor.")
      .def_property_readonly("closed", &FetchQueue::closed)
      .def(
          "stats",
          [](const FetchQueue& q) {
            const FetchStats s = q.stats();
            return std::map<std::string, uint64_t>{
                {"requests", s.requests}, {"retries", s.retries},
                {"failures", s.failures}, {"bytes", s.bytes},
                {"queued", s.queued},     {"in_flight", s.in_flight},
                {"reserved_bytes", s.reserved_bytes},
                {"cache_corrupt_refetches", s.cache_corrupt_refetches}};
          },
          "Counters: requests (attempts), retries, failures, bytes, cache_corrupt_refetches "
          "(cache entries that failed their checksum and were fetched again); now: queued, "
          "in_flight, reserved_bytes.");

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
  py::class_<RemoteScheme>(m, "RemoteScheme",
                           "A url scheme read through a FetchQueue (csrc/io/remote_source.h).")
      .def_readonly("name", &RemoteScheme::name, "As urls spell it, lower case.")
      .def_readonly("aliases", &RemoteScheme::aliases, "Other names read the same way.")
      .def_readonly("store", &RemoteScheme::store,
                    "The kind of store chute.remote opens for it, one of "
                    "chute.remote._stores.STORES ('s3', 'http', ...).");
  m.def("remote_schemes", &remote_schemes, py::return_value_policy::copy,
        "The url schemes read through a FetchQueue: the one list of them.");
}

}  // namespace chute::bindings

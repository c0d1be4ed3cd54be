// The queue of remote requests that chute.remote's executor answers
// (io/fetch_queue.h), the tickets it answers them with, and the url schemes
// read through it. The executor's fetcher is a daemon thread: every call it
// makes that waits releases the GIL through without_gil (GIL.md).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "bindings/engine_face.h"
#include "bindings/registry.h"
#include "core/error.h"
#include "io/fetch_queue.h"
#include "io/remote_source.h"

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
    // The fetcher is a daemon thread: at exit it may be in any of these.
    without_gil([&] { queue_->complete_range(request_.id, bytes, n); });
  }

  void complete_head(uint64_t size, const std::string& etag, const std::string& version) {
    without_gil([&] { queue_->complete_head(request_.id, size, etag, version); });
  }

  void fail(const std::string& kind, int status, const std::string& message, bool retryable) {
    const ErrorKind k = parse_kind(kind);
    without_gil([&] { queue_->fail(request_.id, k, status, message, retryable); });
  }

 private:
  std::shared_ptr<FetchQueue> queue_;
  FetchRequest request_;
};

}  // namespace

void register_fetch_queue(py::module_& m) {
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
            const bool got = without_gil([&] { return q->try_pop(r); });  // the fetcher's call
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
      .def("close", &FetchQueue::close, py::call_guard<ReleasedGil>(),
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

  py::class_<RemoteScheme>(m, "RemoteScheme",
                           "A url scheme read through a FetchQueue (csrc/io/remote_source.h).")
      .def_readonly("name", &RemoteScheme::name, "As urls spell it, lower case.")
      .def_readonly("aliases", &RemoteScheme::aliases, "Other names read the same way.")
      .def_readonly("store", &RemoteScheme::store,
                    "The kind of store chute.remote opens for it, one of "
                    "chute.remote._stores.STORES ('s3', 'http', ...).")
      .def_readonly("store_title", &RemoteScheme::store_title,
                    "What the store is, as the docs' table of schemes says.");
  m.def("remote_schemes", &remote_schemes, py::return_value_policy::copy,
        "The url schemes read through a FetchQueue: the one list of them.");
}

const BindingsFile kFetchQueueBindings{"_core", "fetch_queue", {}, register_fetch_queue};

}  // namespace chute::bindings

// chute::Error as Python sees it: DataError (a ValueError), ReadError (an
// OSError), ValueError or TimeoutError by kind, the message ending in where
// in the engine it was raised.
#pragma once

#include <pybind11/pybind11.h>

#include "batching/skip_log.h"
#include "core/error.h"

namespace chute::bindings {

// The exception object for `error`, not raised (for handlers of skipped
// samples), its scope and place as attributes: failure_scope ("read",
// "member", "field", "batch" or "other"), url, member and sample_key (None
// where not known); a ReadError of a failed system call, OSError's errno,
// strerror and filename.
pybind11::object python_error(const Error& error);

// The exception object of a skip, with the sample it dropped as attributes
// (sample_index, sample_source, sample_offset; None where not known), so
// Python code matches it to its batch without reading the message.
pybind11::object python_skipped(const SkippedSample& skipped);

}  // namespace chute::bindings

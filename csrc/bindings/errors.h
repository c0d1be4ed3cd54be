// chute::Error as Python sees it: DataError (a ValueError), ReadError (an
// OSError), ValueError or TimeoutError by kind, the message ending in where
// in the engine it was raised.
#pragma once

#include <pybind11/pybind11.h>

#include "core/error.h"

namespace chute::bindings {

// The exception object for `error`, not raised (for handlers of skipped samples).
pybind11::object python_error(const Error& error);

}  // namespace chute::bindings

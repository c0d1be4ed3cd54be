// What both engines look like to Python, written once:
//   next(timeout=0.0): the next batch (a Batch), or None when no batch will
//     come. The wait runs in short slices with the GIL released, and
//     Python's signal handlers run between them, so Ctrl-C interrupts it; a
//     timeout > 0 that passes first raises TimeoutError. A failed batch
//     raises its error at its position.
//   stats(): one dict, the same keys from either engine
//     (pipeline/engine_stats.h documents them).
#pragma once

#include <pybind11/pybind11.h>

#include <functional>

#include "pipeline/batch.h"
#include "pipeline/engine_stats.h"
#include "pipeline/ordered_results.h"

namespace chute::bindings {

// `next` is the engine's next(out, slice_seconds); called without the GIL.
pybind11::object wait_for_batch(const std::function<OrderedResults::Status(Batch*, double)>& next,
                                double timeout_s);

pybind11::dict stats_dict(const EngineStats& stats);

}  // namespace chute::bindings

#include "bindings/registry.h"

namespace chute::bindings {

void register_stream(pybind11::module_& /*m*/) {}

}  // namespace chute::bindings

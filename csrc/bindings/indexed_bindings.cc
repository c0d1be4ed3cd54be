#include "bindings/registry.h"

namespace chute::bindings {

void register_indexed(pybind11::module_& /*m*/) {}

}  // namespace chute::bindings

#include "bindings/registry.h"

namespace chute::bindings {

void register_decode(pybind11::module_& /*m*/) {}

}  // namespace chute::bindings

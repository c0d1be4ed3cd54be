#include "bindings/registry.h"

namespace chute::bindings {

void register_tar(pybind11::module_& /*m*/) {}

}  // namespace chute::bindings

// _core's init: every bindings file of csrc/bindings/ registers its part
// (registry.h), so this file lists none of them.
#include "bindings/registry.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "chute's native engine";
  chute::bindings::define_registered_bindings(m, "_core");
}

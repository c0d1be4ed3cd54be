// One registration function per binding file; module.cc calls them all,
// but register_testing_image, which testing_module.cc (chute_testing) calls.
#pragma once

#include <pybind11/pybind11.h>

namespace chute::bindings {

void register_errors(pybind11::module_& m);
void register_batch(pybind11::module_& m);
void register_stream(pybind11::module_& m);
void register_tar(pybind11::module_& m);
void register_decode(pybind11::module_& m);
void register_indexed(pybind11::module_& m);
void register_dropin(pybind11::module_& m);
void register_remote(pybind11::module_& m);
void register_elastic(pybind11::module_& m);
void register_tokens(pybind11::module_& m);
void register_testing_image(pybind11::module_& m);

}  // namespace chute::bindings

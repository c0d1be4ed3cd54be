#include <pybind11/pybind11.h>

#include "bindings/registry.h"
#include "core/error.h"

namespace py = pybind11;

namespace chute::bindings {

void register_errors(py::module_& m) {
  // DataError: the data is bad (subclass of ValueError, as numpy/PIL raise for
  // bad bytes). ReadError: the OS or a pipe command failed (subclass of OSError).
  static py::exception<Error> data_error(m, "DataError", PyExc_ValueError);
  static py::exception<Error> read_error(m, "ReadError", PyExc_OSError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      switch (e.kind()) {
        case ErrorKind::kData:
          py::set_error(data_error, e.what());
          return;
        case ErrorKind::kIo:
          py::set_error(read_error, e.what());
          return;
        case ErrorKind::kUsage:
          py::set_error(PyExc_ValueError, e.what());
          return;
        case ErrorKind::kTimeout:
          py::set_error(PyExc_TimeoutError, e.what());
          return;
      }
    }
  });
}

}  // namespace chute::bindings

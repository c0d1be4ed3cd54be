#include "bindings/errors.h"

#include <string>
#include <system_error>

#include "bindings/registry.h"
#include "bindings/text.h"

namespace py = pybind11;

namespace chute::bindings {
namespace {

// DataError: the data is bad (subclass of ValueError, as numpy/PIL raise for
// bad bytes). ReadError: the OS or a pipe command failed (subclass of OSError).
PyObject* g_data_error = nullptr;
PyObject* g_read_error = nullptr;

const char* scope_name(ErrorScope scope) {
  switch (scope) {
    case ErrorScope::kRead:
      return "read";
    case ErrorScope::kMember:
      return "member";
    case ErrorScope::kField:
      return "field";
    case ErrorScope::kBatch:
      return "batch";
    case ErrorScope::kOther:
      return "other";
  }
  return "other";
}

// A place's name as Python shows names (see text.h); None where not known.
py::object known_name(const std::string& bytes) {
  return bytes.empty() ? py::none() : py::object(name_text(bytes));
}

PyObject* python_class(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kData:
      return g_data_error;
    case ErrorKind::kIo:
      return g_read_error;
    case ErrorKind::kUsage:
      return PyExc_ValueError;
    case ErrorKind::kTimeout:
      return PyExc_TimeoutError;
    case ErrorKind::kMemory:
      return PyExc_MemoryError;
  }
  return PyExc_RuntimeError;
}

}  // namespace

// DataError and ReadError carry the source location at the end of their
// message, where chute.common.errors takes it off (onto `where`) as it picks the
// finer class; the built-in classes get the message alone and `where` here.
// Every class gets the error's scope and place as attributes (failure_scope,
// url, member, sample_key), which chute.common.errors routes it by. A
// ReadError from a failed system call also gets OSError's own errno,
// strerror and filename (None where the call was about no file); its str()
// stays the message (see register_errors).
py::object python_error(const Error& error) {
  const py::object cls = py::reinterpret_borrow<py::object>(python_class(error.kind()));
  py::object exc;
  if (error.kind() == ErrorKind::kData || error.kind() == ErrorKind::kIo) {
    exc = cls(message_text(error.what()));
  } else {
    exc = cls(message_text(error.message()));
    exc.attr("where") = std::string(error.file()) + ":" + std::to_string(error.line());
  }
  exc.attr("failure_scope") = scope_name(error.scope());
  exc.attr("url") = known_name(error.place().url);
  exc.attr("member") = known_name(error.place().member);
  exc.attr("sample_key") = known_name(error.place().key);
  const OsFailure& os_failure = error.os_failure();
  if (error.kind() == ErrorKind::kIo && os_failure.number != 0) {
    exc.attr("errno") = os_failure.number;
    exc.attr("strerror") = std::generic_category().message(os_failure.number);
    exc.attr("filename") = known_name(os_failure.path);
  }
  return exc;
}

py::object python_skipped(const SkippedSample& skipped) {
  const auto known = [](int64_t value) -> py::object {
    return value < 0 ? py::none() : py::object(py::int_(value));
  };
  py::object exc = python_error(skipped.error);
  exc.attr("sample_index") = known(skipped.index);
  exc.attr("sample_source") = known(skipped.source);
  exc.attr("sample_offset") = known(skipped.offset);
  return exc;
}

namespace {

// Each extension translates the errors of its own copy of the engine, with
// a translator local to it: chute_testing links the engine again, and in the
// manylinux wheel's build each extension also carries its own C++ runtime,
// whose exceptions another copy's `catch` does not match.
void translate_errors_of_this_extension() {
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetObject(python_class(e.kind()), python_error(e).ptr());
    }
  });
}

void register_errors(py::module_& m) {
  static py::exception<Error> data_error(m, "DataError", PyExc_ValueError);
  static py::exception<Error> read_error(m, "ReadError", PyExc_OSError);
  g_data_error = data_error.ptr();
  g_read_error = read_error.ptr();
  // OSError's str() is "[Errno N] strerror: 'filename'" once those are set;
  // the engine's message, its argument, says all that and names the data too.
  read_error.attr("__str__") = py::cpp_function(
      [](const py::object& self) -> py::str {
        return py::reinterpret_borrow<py::object>(PyExc_BaseException).attr("__str__")(self);
      },
      py::name("__str__"), py::is_method(read_error));
  translate_errors_of_this_extension();
}

// chute_testing raises _core's classes. It holds a reference to each that
// it never drops: a static py::object would drop it at exit, after the
// interpreter is gone.
void register_testing_errors(py::module_&) {
  const py::module_ core = py::module_::import("chute._core");
  g_data_error = py::object(core.attr("DataError")).release().ptr();
  g_read_error = py::object(core.attr("ReadError")).release().ptr();
  translate_errors_of_this_extension();
}

}  // namespace

// Both extensions compile this file; each defines only its own part.
const BindingsFile kErrorsBindings{"_core", "errors", {}, register_errors};
const BindingsFile kTestingErrorsBindings{"chute_testing", "errors", {}, register_testing_errors};

}  // namespace chute::bindings

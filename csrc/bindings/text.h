// Bytes of the engine as Python text, and back. Tar member names are bytes:
// tarfile decodes them as UTF-8 with surrogateescape (the filesystem
// encoding here), so keys and extensions come out as the same str objects
// webdataset gives, and go back to the same bytes. Messages name them too;
// there the undecodable bytes show as \xNN escapes, so that a message prints
// anywhere (a str with lone surrogates cannot be written to a UTF-8 stream).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/typing.h>

#include <string>
#include <vector>

namespace chute::bindings {

// Member names, keys, extensions, paths: UTF-8 with surrogateescape.
inline pybind11::str name_text(const std::string& bytes) {
  PyObject* o = PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()),
                                     "surrogateescape");
  if (o == nullptr) throw pybind11::error_already_set();
  return pybind11::reinterpret_steal<pybind11::str>(o);
}

// Error messages: UTF-8 with backslashreplace.
inline pybind11::str message_text(const std::string& bytes) {
  PyObject* o = PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()),
                                     "backslashreplace");
  if (o == nullptr) throw pybind11::error_already_set();
  return pybind11::reinterpret_steal<pybind11::str>(o);
}

// The bytes of a name given as str (encoded back with surrogateescape), as
// bytes, or as an os.PathLike (os.fsencode's rule).
inline std::string name_bytes(pybind11::handle value) {
  PyObject* fs = nullptr;
  if (PyUnicode_Check(value.ptr())) {
    fs = PyUnicode_AsEncodedString(value.ptr(), "utf-8", "surrogateescape");
  } else {
    // PyUnicode_FSConverter takes bytes and os.PathLike alike.
    if (PyUnicode_FSConverter(value.ptr(), &fs) == 0) fs = nullptr;
  }
  if (fs == nullptr) throw pybind11::error_already_set();
  const pybind11::bytes owned = pybind11::reinterpret_steal<pybind11::bytes>(fs);
  return std::string(owned);
}

inline pybind11::typing::List<pybind11::str> name_list(const std::vector<std::string>& names) {
  pybind11::list out(names.size());
  for (size_t i = 0; i < names.size(); ++i) out[i] = name_text(names[i]);
  return out;
}

inline std::vector<std::string> name_bytes_list(const pybind11::typing::Iterable<pybind11::str>& values) {
  std::vector<std::string> out;
  for (pybind11::handle v : values) out.push_back(name_bytes(v));
  return out;
}

}  // namespace chute::bindings

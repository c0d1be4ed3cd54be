// Names from tar headers as Python strings that never fail to convert. Tar
// member names are bytes; webdataset (Python's tarfile) decodes them as UTF-8
// with "surrogateescape", so a name that is not valid UTF-8 still gives a key
// (its stray bytes as U+DC80..U+DCFF) instead of a UnicodeDecodeError. Keys
// and extensions are decoded that way here; messages, which are read by
// people, show stray bytes as \xNN.
#include <pybind11/pybind11.h>

#include <string>

#include "bindings/registry.h"
#include "pipeline/batch.h"
#include "pipeline/stream_engine.h"

namespace py = pybind11;

namespace chute::bindings {
namespace {

py::str decode_utf8(const std::string& s, const char* errors) {
  PyObject* out = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), errors);
  if (out == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(out);
}

py::str name_str(const std::string& s) { return decode_utf8(s, "surrogateescape"); }

}  // namespace

void register_names(py::module_& m) {
  m.def(
      "_batch_keys",
      [](const Batch& batch) {
        py::list out(batch.keys.size());
        for (size_t i = 0; i < batch.keys.size(); ++i) out[i] = name_str(batch.keys[i]);
        return out;
      },
      "Batch.keys() with tar names decoded as webdataset decodes them (UTF-8, surrogateescape).");
  m.def(
      "_batch_other_members",
      [](const Batch& batch) {
        py::list rows(batch.other_members.size());
        for (size_t i = 0; i < batch.other_members.size(); ++i) {
          py::dict d;
          for (const auto& [ext, payload] : batch.other_members[i]) d[name_str(ext)] = py::bytes(payload);
          rows[i] = d;
        }
        return rows;
      },
      "Batch.other_members() with extensions decoded as webdataset decodes them.");
  m.def(
      "_take_skip_messages",
      [](StreamEngine& engine) {
        const std::vector<std::string> messages = engine.take_skip_messages();
        py::list out(messages.size());
        for (size_t i = 0; i < messages.size(); ++i) {
          out[i] = decode_utf8(messages[i], "backslashreplace");
        }
        return out;
      },
      "StreamEngine.take_skip_messages() with stray bytes of tar names shown as \\xNN.");
}

}  // namespace chute::bindings
